use lockkit_macros::locked;

#[locked(client = CLIENT, key = "ticket:{ticket_id}")]
async fn buy(id: u64) -> Result<(), String> {
    let _ = id;
    Ok(())
}

fn main() {}
