//! Server profiles: a plain server, or one that imitates what a managed Redis service allows.
//!
//! Managed services (ElastiCache, Memorystore, Azure) block administrative commands for their
//! customers but keep them for the operator. The [`Profile::ManagedService`] server does the
//! same: the blocked commands are renamed to names only the kit knows
//! (`lockkit-operator-<command>`), so a client under test finds them missing while the kit's own
//! [`RedisServer::command`](crate::RedisServer::command) (fault injection, `SAVE`, `CONFIG SET`)
//! still reaches them under the operator's name. `CLIENT` subcommands that Memorystore lacks are
//! denied to the default user by an ACL rule, so they answer `NOPERM`.
//!
//! The environment variable [`PROFILE_ENV`] (`LOCKKIT_TEST_PROFILE`) sets the profile of every
//! server a test starts with the default options: `plain` (the default) or `managed`. That is how
//! `scripts/test` runs whole test files against a managed-service imitation.

use crate::TestkitError;

/// The environment variable that sets the default [`Profile`]: `plain` or `managed`.
pub const PROFILE_ENV: &str = "LOCKKIT_TEST_PROFILE";

/// Commands a managed service blocks, renamed away on a [`Profile::ManagedService`] server:
/// ElastiCache blocks `CONFIG`, `DEBUG`, `SAVE`, `BGSAVE`, `REPLICAOF` and `SHUTDOWN`;
/// ElastiCache Serverless and proxy clusters have no `WAIT`; several services refuse `KEYS`.
pub const MANAGED_BLOCKED_COMMANDS: [&str; 8] = [
    "CONFIG",
    "DEBUG",
    "SAVE",
    "BGSAVE",
    "WAIT",
    "SHUTDOWN",
    "KEYS",
    "REPLICAOF",
];

/// The `CLIENT` subcommands Memorystore offers (those that Redis 6.2 and 7.0 know): on a
/// [`Profile::ManagedService`] server every other `CLIENT` subcommand (`NO-EVICT`, `PAUSE`,
/// `UNPAUSE`, `UNBLOCK`, Valkey's newer ones) is denied to the default user.
pub const MANAGED_CLIENT_SUBCOMMANDS: [&str; 12] = [
    "caching",
    "getname",
    "getredir",
    "help",
    "id",
    "info",
    "kill",
    "list",
    "reply",
    "setname",
    "tracking",
    "trackinginfo",
];

/// The scripting commands renamed away on a [`Profile::NoScripting`] server.
pub const SCRIPTING_COMMANDS: [&str; 3] = ["EVAL", "EVALSHA", "SCRIPT"];

/// What kind of server [`RedisServer::start_with`](crate::RedisServer::start_with) starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Profile {
    /// Every command available.
    #[default]
    Plain,
    /// A managed service's restrictions: [`MANAGED_BLOCKED_COMMANDS`] renamed away, every
    /// `CLIENT` subcommand but [`MANAGED_CLIENT_SUBCOMMANDS`] denied.
    ManagedService,
    /// A server that runs no Lua scripts: [`SCRIPTING_COMMANDS`] renamed away (as a service
    /// that forbids scripting, or Valkey without its Lua module, shows it to clients).
    NoScripting,
}

impl Profile {
    /// The profile named by [`PROFILE_ENV`], [`Profile::Plain`] when it is unset or empty.
    ///
    /// # Errors
    /// [`TestkitError::Config`] naming the variable when its value is not `plain` or `managed`.
    pub fn from_env() -> Result<Profile, TestkitError> {
        match std::env::var(PROFILE_ENV) {
            Err(_) => Ok(Profile::Plain),
            Ok(value) => match value.as_str() {
                "" | "plain" => Ok(Profile::Plain),
                "managed" => Ok(Profile::ManagedService),
                other => Err(TestkitError::Config(format!(
                    "{PROFILE_ENV}={other:?} is not a profile: use `plain` or `managed`"
                ))),
            },
        }
    }

    /// The commands this profile renames away.
    pub fn renamed_commands(self) -> &'static [&'static str] {
        match self {
            Profile::Plain => &[],
            Profile::ManagedService => &MANAGED_BLOCKED_COMMANDS,
            Profile::NoScripting => &SCRIPTING_COMMANDS,
        }
    }

    /// The `redis-server` arguments of this profile.
    pub(crate) fn server_args(self) -> Vec<String> {
        let mut args = Vec::new();
        for command in self.renamed_commands() {
            args.extend([
                "--rename-command".to_owned(),
                (*command).to_owned(),
                operator_alias(command),
            ]);
        }
        if self == Profile::ManagedService {
            // An allow-list (`-client +client|id …`), which Redis 6.2 accepts too (its ACL has
            // no rule that denies one subcommand).
            args.extend(
                [
                    "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-client",
                ]
                .into_iter()
                .map(str::to_owned),
            );
            args.extend(
                MANAGED_CLIENT_SUBCOMMANDS
                    .iter()
                    .map(|sub| format!("+client|{sub}")),
            );
        }
        args
    }

    /// `args` with its command replaced by the operator's name when this profile renamed it.
    pub(crate) fn as_operator<'a>(self, args: &[&'a str]) -> Vec<std::borrow::Cow<'a, str>> {
        use std::borrow::Cow;
        let mut out: Vec<Cow<'a, str>> = args.iter().map(|arg| Cow::Borrowed(*arg)).collect();
        if let Some(first) = args.first() {
            if self
                .renamed_commands()
                .iter()
                .any(|command| command.eq_ignore_ascii_case(first))
            {
                out[0] = Cow::Owned(operator_alias(first));
            }
        }
        out
    }
}

/// The name only the kit knows for a renamed `command`.
pub fn operator_alias(command: &str) -> String {
    format!("lockkit-operator-{}", command.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renamed_commands_go_to_the_operator_name_and_others_are_left_alone() {
        let managed = Profile::ManagedService;
        let args = managed.as_operator(&["config", "SET", "maxmemory-policy", "allkeys-lru"]);
        assert_eq!(args[0], "lockkit-operator-config");
        assert_eq!(args[1], "SET");
        assert_eq!(managed.as_operator(&["GET", "CONFIG"])[0], "GET");
        assert_eq!(Profile::Plain.as_operator(&["CONFIG", "GET"])[0], "CONFIG");
        assert_eq!(
            Profile::NoScripting.as_operator(&["EVAL"])[0],
            "lockkit-operator-eval"
        );
    }

    #[test]
    fn managed_args_rename_every_blocked_command_and_deny_the_client_subcommands() {
        let args = Profile::ManagedService.server_args();
        for command in MANAGED_BLOCKED_COMMANDS {
            assert!(
                args.windows(3)
                    .any(|w| w[0] == "--rename-command" && w[1] == command),
                "{command} renamed"
            );
        }
        assert!(args.contains(&"-client".to_owned()));
        assert!(args.contains(&"+client|setname".to_owned()));
        assert!(Profile::Plain.server_args().is_empty());
    }
}
