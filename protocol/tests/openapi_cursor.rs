//! The event cursor is typed the same way in both places a client can send it: the `after`
//! query parameter and the `Last-Event-ID` header are integers (the server answers 400 for
//! anything else), so generated clients must not send arbitrary strings.

use protocol::schema::openapi_document;

#[test]
fn both_event_cursors_are_non_negative_integers() {
    let document = openapi_document();
    for name in ["After", "LastEventId"] {
        let schema = &document["components"]["parameters"][name]["schema"];
        assert_eq!(schema["type"], "integer", "{name}: {schema}");
        assert_eq!(schema["minimum"], 0, "{name}: {schema}");
        assert_eq!(
            schema["maximum"], 9_007_199_254_740_991_u64,
            "{name}: {schema}"
        );
    }
}
