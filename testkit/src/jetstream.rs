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

/// The state of stream `name` on the server (messages, first and last sequence, ...), asked
/// again for up to 30 s while the stream cannot answer (on a cluster, during an election of
/// its leader).
pub async fn stream_state(js: &Context, name: &str) -> State {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let error = match js.get_stream(name).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => return info.state.clone(),
                Err(e) => format!("info of stream {name}: {e}"),
            },
            Err(e) => format!("stream {name}: {e}"),
        };
        assert!(std::time::Instant::now() < deadline, "{error}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// A replicated stream, or a consumer of one: a group with a leader of its own on a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Group {
    Stream(String),
    /// Stream, consumer.
    Consumer(String, String),
}

/// The server name leading `group` now (`None` during an election, or while it cannot be read).
pub async fn leader(js: &Context, group: &Group) -> Option<String> {
    let cluster = match group {
        Group::Stream(name) => {
            let mut stream = js.get_stream(name).await.ok()?;
            stream.info().await.ok()?.cluster.clone()
        }
        Group::Consumer(stream, name) => {
            let stream = js.get_stream(stream).await.ok()?;
            stream.consumer_info(name).await.ok()?.cluster
        }
    };
    cluster?.leader
}

/// Asks `group`'s leader to hand leadership to server `to` (as `nats stream cluster step-down
/// --preferred` does); what the server answers is not checked: read [`leader`].
pub async fn ask_leader(js: &Context, group: &Group, to: &str) {
    let api = match group {
        Group::Stream(s) => format!("STREAM.LEADER.STEPDOWN.{s}"),
        Group::Consumer(s, c) => format!("CONSUMER.LEADER.STEPDOWN.{s}.{c}"),
    };
    let body = serde_json::json!({ "placement": { "preferred": to } });
    let _: Result<serde_json::Value, _> = js.request(api, &body).await;
}
