use lockkit_macros::locked;

#[locked(key = "ticket:{id}", wait = "5s")]
async fn buy(id: u64) -> Result<(), String> {
    let _ = id;
    Ok(())
}

fn main() {}
