//! The `#[locked]` attribute of [lockkit](https://docs.rs/lockkit): run an `async fn` under a
//! distributed lock whose name is built from the function's arguments.
//!
//! Use it through lockkit's `macros` feature, as `#[lockkit::locked(...)]`; this crate holds only
//! the macro. See [`locked`] for the attribute's arguments and the code it generates.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, ItemFn, LitStr, Pat, ReturnType, Token, Type};

/// Runs an `async fn` under a lockkit [`Lock`](https://docs.rs/lockkit/latest/lockkit/struct.Lock.html)
/// named after its arguments, and releases the lock only after the function's body — including
/// any transaction it commits — has completed.
///
/// ```ignore
/// use lockkit::locked;
///
/// struct Tickets { locks: lockkit::Client /* , db: ... */ }
///
/// impl Tickets {
///     // Wait at most 5 s for the lock, hold it for at most 3 s (Spring's
///     // `@DistributedLock(key = "#id", waitTime = 5, leaseTime = 3)`).
///     #[locked(client = self.locks, key = "ticket:{id}", wait = "5s", lease = "3s")]
///     async fn buy(&self, id: u64, buyer: &str) -> Result<u32, MyError> {
///         // read stock, decrement, commit: nobody else runs this for the same `id` meanwhile
///         # Ok(0)
///     }
/// }
/// ```
///
/// # Arguments
///
/// - `client = <expr>` (required): evaluates to a `lockkit::Client`, a `&lockkit::Client`, or
///   anything that derefs to one (`Arc<Client>`, `LazyLock<Client>`) — a field such as
///   `self.locks`, a static, a function call. It is evaluated on every call, before the lock is
///   taken.
/// - `key = "ticket:{id}"` (required): the lock's name, a format string whose `{…}` placeholders
///   name the function's arguments (`{id}`), or fields of them (`{order.id}`, `{self.shard}`);
///   each is formatted with `Display`. `{{` and `}}` are literal braces. An unknown argument
///   name is a compile error.
/// - `wait = "5s"` (optional): how long to wait for the lock. When it is not acquired in time
///   the function returns `Err(lockkit::Error::NotAcquired { .. }.into())` without running its
///   body; `"0s"` makes one attempt. Absent: wait without bound (as `Lock::lock`).
/// - `lease = "3s"` (optional): hold the lock for at most this long, without renewal. Absent:
///   watchdog mode — the client renews the lease while the body runs, so a slow body keeps the
///   lock and a crashed process loses it after the watchdog timeout.
///
/// - `kind = "fair"` or `kind = "spin"` (optional): take a `FairLock` (granted in request order)
///   or a `SpinLock` (the plain `SET NX PX` lock: not reentrant, so a `#[locked]` fn calling
///   itself, or another one on the same key, waits for itself) instead of the default reentrant
///   `Lock` (`kind = "lock"`). Each kind has its own keys: a fair lock and a lock of the same name
///   do not exclude each other.
///
/// Durations are an integer and a unit: `ms`, `s`, `m` or `h` (`"500ms"`, `"5s"`, `"2m"`),
/// checked at compile time. A lease must be above zero and at most 365 days (`MAX_LEASE`).
///
/// # The function
///
/// It must be an `async fn` returning a `Result<T, E>` (or an alias whose name ends in `Result`)
/// with `E: From<lockkit::Error>`: the lock's own errors (Redis failing, the client shut down, not
/// acquired in time) are returned through `E`. Methods (`&self`, `&mut self`, `self`) and generic
/// functions work; a return type containing `impl Trait` does not.
///
/// # What it generates
///
/// 1. Build the name from the arguments and take the lock (`try_lock(wait, lease)`, or
///    `lock()` / `lock_with_lease(lease)` without `wait`), in the calling task.
/// 2. Run the original body to completion.
/// 3. `unlock().await` the hold. If the body returned `Ok` but the release failed — typically
///    `Error::NotHeld`, because a fixed lease ran out while the body ran, so the section may not
///    have been exclusive — the function returns that error instead. If the body returned `Err`,
///    that error is returned and a release failure is not reported over it.
///
/// If the function's future is dropped before it finishes (a timeout, a cancelled task), the
/// lock's guard is dropped with it and released in the background, as with any lockkit guard.
#[proc_macro_attribute]
pub fn locked(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item2: TokenStream2 = item.clone().into();
    let result = syn::parse::<Args>(attr).and_then(|args| {
        let func = syn::parse::<ItemFn>(item)?;
        expand(args, func)
    });
    match result {
        Ok(tokens) => tokens.into(),
        // Keep the function as written, so the only errors are the attribute's own.
        Err(err) => {
            let err = err.to_compile_error();
            quote!(#err #item2).into()
        }
    }
}

/// `lockkit::MAX_LEASE` (365 days), in milliseconds.
const MAX_LEASE_MS: u64 = 365 * 24 * 3_600_000;

/// The attribute's arguments.
struct Args {
    client: Expr,
    key: LitStr,
    wait: Option<(LitStr, u64)>,
    lease: Option<(LitStr, u64)>,
    kind: Kind,
}

/// Which lock the attribute takes.
#[derive(Clone, Copy)]
enum Kind {
    Lock,
    Fair,
    Spin,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut client = None;
        let mut key = None;
        let mut wait = None;
        let mut lease = None;
        let mut kind: Option<Kind> = None;
        while !input.is_empty() {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let duplicate =
                || syn::Error::new(name.span(), format!("`{name}` is given more than once"));
            match name.to_string().as_str() {
                "client" => {
                    if client.is_some() {
                        return Err(duplicate());
                    }
                    client = Some(input.parse::<Expr>()?);
                }
                "key" => {
                    if key.is_some() {
                        return Err(duplicate());
                    }
                    let lit: LitStr = input.parse()?;
                    if lit.value().is_empty() {
                        return Err(syn::Error::new(lit.span(), "`key` is empty"));
                    }
                    key = Some(lit);
                }
                "wait" | "lease" => {
                    let lit: LitStr = input.parse()?;
                    let millis = parse_duration(&lit.value()).map_err(|msg| {
                        syn::Error::new(lit.span(), format!("invalid `{name}` duration: {msg}"))
                    })?;
                    let slot = if name == "wait" { &mut wait } else { &mut lease };
                    if slot.is_some() {
                        return Err(duplicate());
                    }
                    if name == "lease" && millis > MAX_LEASE_MS {
                        return Err(syn::Error::new(
                            lit.span(),
                            "a `lease` may be at most 365 days (lockkit's MAX_LEASE)",
                        ));
                    }
                    if name == "lease" && millis == 0 {
                        return Err(syn::Error::new(
                            lit.span(),
                            "a `lease` must be above zero (leave it out for watchdog mode)",
                        ));
                    }
                    *slot = Some((lit, millis));
                }
                "kind" => {
                    let lit: LitStr = input.parse()?;
                    if kind.is_some() {
                        return Err(duplicate());
                    }
                    kind = Some(match lit.value().as_str() {
                        "lock" => Kind::Lock,
                        "fair" => Kind::Fair,
                        "spin" => Kind::Spin,
                        "fenced" => {
                            return Err(syn::Error::new(
                                lit.span(),
                                "#[locked] does not take a fenced lock: the body could not see its token; use `client.fenced_lock(name)` directly",
                            ))
                        }
                        other => {
                            return Err(syn::Error::new(
                                lit.span(),
                                format!("unknown `kind` \"{other}\"; expected \"lock\" (the default), \"fair\" or \"spin\""),
                            ))
                        }
                    });
                }
                other => {
                    return Err(syn::Error::new(
                        name.span(),
                        format!(
                            "unknown argument `{other}` of #[locked]; expected `client`, `key`, `wait`, `lease` or `kind`"
                        ),
                    ))
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        let missing = |what: &str, example: &str| {
            syn::Error::new(
                Span::call_site(),
                format!("#[locked] needs `{what}`, e.g. #[locked({example})]"),
            )
        };
        Ok(Args {
            client: client.ok_or_else(|| {
                missing(
                    "client = <expr>",
                    "client = self.locks, key = \"ticket:{id}\"",
                )
            })?,
            key: key.ok_or_else(|| {
                missing(
                    "key = \"...\"",
                    "client = self.locks, key = \"ticket:{id}\"",
                )
            })?,
            wait,
            lease,
            kind: kind.unwrap_or(Kind::Lock),
        })
    }
}

/// Parses `"500ms"`, `"5s"`, `"2m"`, `"1h"` into milliseconds.
fn parse_duration(text: &str) -> Result<u64, String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    if number.is_empty() {
        return Err(format!(
            "`{text}` does not start with a whole number; write e.g. \"500ms\", \"5s\", \"2m\""
        ));
    }
    let factor: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(format!("`{text}` has no unit; add one of ms, s, m, h")),
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`; use one of ms, s, m, h"
            ))
        }
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// One piece of the key's format string.
enum Piece {
    Text(String),
    /// An argument, and the fields under it: `order.id` is `("order", ["id"])`.
    Arg(String, Vec<String>),
}

/// Splits the key's format string into text and `{arg.field}` placeholders.
fn parse_key(key: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = key.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => return Err("unmatched `}` (write `}}` for a literal brace)".to_owned()),
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err("unclosed `{` (write `{{` for a literal brace)".to_owned())
                        }
                    }
                }
                let mut path = inner.trim().split('.').map(str::to_owned);
                let arg = path.next().unwrap_or_default();
                let fields: Vec<String> = path.collect();
                let valid = |s: &String| syn::parse_str::<Ident>(s).is_ok() || s == "self";
                let valid_field = |s: &String| valid(s) || s.parse::<u32>().is_ok();
                if !valid(&arg) || !fields.iter().all(valid_field) {
                    return Err(format!(
                        "`{{{inner}}}` is not an argument name or a field path such as `{{order.id}}`"
                    ));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Arg(arg, fields));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// The names the key may use: the receiver (`self`) and every argument bound to a plain name.
fn argument_names(func: &ItemFn) -> Vec<String> {
    func.sig
        .inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(_) => Some("self".to_owned()),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(ident) => Some(ident.ident.to_string()),
                _ => None,
            },
        })
        .collect()
}

/// Whether `ty` is a path whose last segment is named `Result` (`Result<T, E>`, `io::Result<T>`,
/// `anyhow::Result<T>`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|segment| segment.ident.to_string().ends_with("Result")),
        Type::Group(group) => is_result(&group.elem),
        Type::Paren(paren) => is_result(&paren.elem),
        _ => false,
    }
}

fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "#[locked] goes on an `async fn`: the lock is awaited before the body runs",
        ));
    }
    let ret = match &sig.output {
        ReturnType::Type(_, ty) if is_result(ty) => ty,
        ReturnType::Type(_, ty) => {
            return Err(syn::Error::new(
                ty.span(),
                "#[locked] needs a function returning `Result<T, E>` with `E: From<lockkit::Error>`, to report the lock's errors",
            ))
        }
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.paren_token.span.join(),
                "#[locked] needs a function returning `Result<T, E>` with `E: From<lockkit::Error>`, to report the lock's errors; this one returns `()`",
            ))
        }
    };

    // The key: a `format!` with one positional argument per placeholder.
    let key_span = args.key.span();
    let pieces = parse_key(&args.key.value())
        .map_err(|msg| syn::Error::new(key_span, format!("invalid `key`: {msg}")))?;
    let names = argument_names(&func);
    let mut format = String::new();
    let mut values = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Piece::Arg(arg, fields) => {
                if !names.contains(&arg) {
                    let known = names
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let known = if known.is_empty() {
                        "it has none".to_owned()
                    } else {
                        format!("it has {known}")
                    };
                    return Err(syn::Error::new(
                        key_span,
                        format!(
                            "`key` names `{arg}`, which is not an argument of `{}` ({known})",
                            sig.ident
                        ),
                    ));
                }
                format.push_str("{}");
                let root = if arg == "self" {
                    quote_spanned!(key_span=> self)
                } else {
                    let ident = Ident::new(&arg, key_span);
                    ident.into_token_stream()
                };
                let fields = fields.iter().map(|field| match field.parse::<u32>() {
                    Ok(index) => syn::Index {
                        index,
                        span: key_span,
                    }
                    .into_token_stream(),
                    Err(_) => Ident::new(field, key_span).into_token_stream(),
                });
                values.push(quote_spanned!(key_span=> &#root #(.#fields)*));
            }
        }
    }
    let format = LitStr::new(&format, key_span);

    let client = &args.client;
    let (handle, constructor) = match args.kind {
        Kind::Lock => (quote!(::lockkit::Lock), quote!(lock)),
        Kind::Fair => (quote!(::lockkit::FairLock), quote!(fair_lock)),
        Kind::Spin => (quote!(::lockkit::SpinLock), quote!(spin_lock)),
    };
    let acquire = match &args.wait {
        Some((lit, millis)) => {
            let lease = match &args.lease {
                Some((lit, millis)) => quote_spanned!(lit.span()=>
                    ::core::option::Option::Some(::core::time::Duration::from_millis(#millis))
                ),
                None => quote!(::core::option::Option::None),
            };
            let wait = quote_spanned!(lit.span()=> ::core::time::Duration::from_millis(#millis));
            quote! {
                match #handle::try_lock(&__lockkit_lock, #wait, #lease).await {
                    ::core::result::Result::Ok(::core::option::Option::Some(guard)) => guard,
                    ::core::result::Result::Ok(::core::option::Option::None) => {
                        return ::core::result::Result::Err(::core::convert::From::from(
                            ::lockkit::Error::NotAcquired {
                                name: ::std::borrow::ToOwned::to_owned(#handle::name(&__lockkit_lock)),
                                waited: #wait,
                            },
                        ));
                    }
                    ::core::result::Result::Err(err) => {
                        return ::core::result::Result::Err(::core::convert::From::from(err));
                    }
                }
            }
        }
        None => {
            let call = match &args.lease {
                Some((lit, millis)) => {
                    let lease =
                        quote_spanned!(lit.span()=> ::core::time::Duration::from_millis(#millis));
                    quote!(#handle::lock_with_lease(&__lockkit_lock, #lease))
                }
                None => quote!(#handle::lock(&__lockkit_lock)),
            };
            quote! {
                match #call.await {
                    ::core::result::Result::Ok(guard) => guard,
                    ::core::result::Result::Err(err) => {
                        return ::core::result::Result::Err(::core::convert::From::from(err));
                    }
                }
            }
        }
    };

    let attrs = &func.attrs;
    let vis = &func.vis;
    let block = &func.block;
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            // `&(client)` coerces to `&Client` from a `Client`, a `&Client`, or anything that
            // derefs to one (an `Arc<Client>`, a `LazyLock<Client>`).
            let __lockkit_lock: #handle = ::lockkit::Client::#constructor(
                &(#client),
                ::std::format!(#format, #(#values),*),
            );
            let __lockkit_guard: ::lockkit::LockGuard = #acquire;
            // The original body, run to completion while the lock is held. The unreachable
            // `return` fixes the block's output type to the function's, so `?` inside it
            // converts errors as it would in the function itself.
            // The body runs inside the hold's scope: the same lock taken again anywhere inside
            // it (a nested `#[locked]` call) re-enters.
            let __lockkit_output: #ret = ::lockkit::LockGuard::scope(&__lockkit_guard, async move {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::needless_return
                )]
                if false {
                    let __lockkit_never: #ret = loop {};
                    return __lockkit_never;
                }
                #block
            })
            .await;
            match ::lockkit::LockGuard::unlock(__lockkit_guard).await {
                ::core::result::Result::Ok(()) => __lockkit_output,
                ::core::result::Result::Err(err) => {
                    if ::core::result::Result::is_ok(&__lockkit_output) {
                        ::core::result::Result::Err(::core::convert::From::from(err))
                    } else {
                        __lockkit_output
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, parse_key, Args, Piece};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(500));
        assert_eq!(parse_duration("0s"), Ok(0));
        assert_eq!(parse_duration("5s"), Ok(5_000));
        assert_eq!(parse_duration("2m"), Ok(120_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000));
        for bad in [
            "5",
            "s",
            "",
            "5 s",
            "1.5s",
            "-1s",
            "5sec",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn arguments() {
        let ok = |text: &str| {
            syn::parse_str::<Args>(text)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(ok(r#"client = self.locks, key = "a:{id}""#), Ok(()));
        assert_eq!(
            ok(r#"client = &*LOCKS, key = "a", wait = "0s", lease = "8760h", kind = "spin","#),
            Ok(())
        );
        for (bad, message) in [
            (r#"key = "a""#, "needs `client"),
            (r#"client = c"#, "needs `key"),
            (r#"client = c, key = """#, "`key` is empty"),
            (r#"client = c, key = "a", lease = "0s""#, "above zero"),
            (
                r#"client = c, key = "a", lease = "8761h""#,
                "at most 365 days",
            ),
            (
                r#"client = c, key = "a", wait = "1s", wait = "2s""#,
                "more than once",
            ),
            (r#"client = c, key = "a", kind = "rw""#, "unknown `kind`"),
            (
                r#"client = c, key = "a", timeout = "1s""#,
                "unknown argument `timeout`",
            ),
        ] {
            match ok(bad) {
                Ok(()) => panic!("{bad:?} accepted"),
                Err(err) => assert!(err.contains(message), "{bad:?}: {err}"),
            }
        }
    }

    fn render(key: &str) -> Result<String, String> {
        Ok(parse_key(key)?
            .into_iter()
            .map(|piece| match piece {
                Piece::Text(text) => format!("[{text}]"),
                Piece::Arg(arg, fields) => format!("<{arg}{}>", fields.concat()),
            })
            .collect())
    }

    #[test]
    fn keys() {
        assert_eq!(render("ticket:{id}").as_deref(), Ok("[ticket:]<id>"));
        assert_eq!(
            render("{self.a}:{order.customer.name}:{pair.0}").as_deref(),
            Ok("<selfa>[:]<ordercustomername>[:]<pair0>")
        );
        assert_eq!(
            render("{{literal}}:{ id }").as_deref(),
            Ok("[{literal}:]<id>")
        );
        for bad in ["{}", "{a b}", "{a.}", "{1}", "open{", "close}", "{a:?}"] {
            assert!(render(bad).is_err(), "{bad:?} accepted");
        }
    }
}
