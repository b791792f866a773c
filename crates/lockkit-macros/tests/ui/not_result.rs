use lockkit_macros::locked;

#[locked(client = CLIENT, key = "ticket:{id}")]
async fn buy(id: u64) -> u64 {
    id
}

fn main() {}
