use lockkit_macros::locked;

#[locked(client = CLIENT, key = "ticket:{id}", kind = "fenced")]
async fn buy(id: u64) -> Result<(), String> {
    let _ = id;
    Ok(())
}

fn main() {}
