//! What a JetStream server holds, read the way an operator would (`nats stream info`), for
//! assertions on the layout and contents of streams.

use async_nats::jetstream::Context;
use async_nats::jetstream::stream::State;

/// A plain JetStream client of the server at `url`: another program's view of the streams, to
/// stage or inspect them apart from the runtime's own connection and settings.
pub async fn connect(url: &str) -> Context {
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    async_nats::jetstream::new(client)
}

/// The state of stream `name` on the server (messages, first and last sequence, ...).
pub async fn stream_state(js: &Context, name: &str) -> State {
    js.get_stream(name)
        .await
        .unwrap_or_else(|e| panic!("stream {name}: {e}"))
        .info()
        .await
        .unwrap_or_else(|e| panic!("info of stream {name}: {e}"))
        .state
        .clone()
}
