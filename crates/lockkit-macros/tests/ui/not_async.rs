use lockkit_macros::locked;

#[locked(client = CLIENT, key = "ticket:{id}")]
fn buy(id: u64) -> Result<(), String> {
    let _ = id;
    Ok(())
}

fn main() {}
