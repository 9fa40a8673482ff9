//! Pins the webhook body and signature to `compat/phutil-json-vectors.json`, which holds
//! the bytes Phorge's real PHP (`PhutilJSON`, `hash_hmac`) produced for each input.

use phorge_wire::phid::object_type_or_unknown;
use phorge_wire::phutil_json::encode_formatted;
use phorge_wire::webhook::{sign, RequestProperties, WebhookPayload};
use serde_json::Value;

const VECTORS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../compat/phutil-json-vectors.json"
);

struct Vector {
    name: String,
    input: Value,
    key: String,
    body: String,
    signature: String,
}

fn load_vectors() -> Vec<Vector> {
    let text = std::fs::read_to_string(VECTORS).expect("read compat/phutil-json-vectors.json");
    let vectors: Value = serde_json::from_str(&text).expect("vectors are JSON");
    let vectors = vectors.as_array().expect("vectors are a list");
    assert!(!vectors.is_empty(), "no vectors");
    vectors
        .iter()
        .map(|v| Vector {
            name: v["name"].as_str().expect("name").to_owned(),
            input: v["payload_input"].clone(),
            key: v["key"].as_str().expect("key").to_owned(),
            body: v["body"].as_str().expect("body").to_owned(),
            signature: v["signature"].as_str().expect("signature").to_owned(),
        })
        .collect()
}

fn phids(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("phid list")
        .iter()
        .map(|entry| entry["phid"].as_str().expect("phid").to_owned())
        .collect()
}

/// Builds the payload from the parts a request row provides, as the service does.
fn payload_from_row_parts(input: &Value) -> WebhookPayload {
    let action = &input["action"];
    WebhookPayload {
        object_phid: input["object"]["phid"]
            .as_str()
            .expect("object phid")
            .to_owned(),
        trigger_phids: phids(&input["triggers"]),
        transaction_phids: phids(&input["transactions"]),
        test: action["test"].as_bool().expect("test"),
        silent: action["silent"].as_bool().expect("silent"),
        secure: action["secure"].as_bool().expect("secure"),
        epoch: action["epoch"].as_u64().expect("epoch"),
    }
}

#[test]
fn every_vector_body_and_signature_match_php() {
    for vector in load_vectors() {
        let payload = payload_from_row_parts(&vector.input);
        assert_eq!(
            object_type_or_unknown(&payload.object_phid),
            vector.input["object"]["type"].as_str().expect("type"),
            "{}: object type",
            vector.name
        );
        let body = payload.encode_body();
        assert_eq!(
            String::from_utf8(body.clone()).expect("body is UTF-8"),
            vector.body,
            "{}: body bytes",
            vector.name
        );
        assert_eq!(
            sign(vector.key.as_bytes(), &body),
            vector.signature,
            "{}: signature",
            vector.name
        );
    }
}

#[test]
fn encoder_reproduces_every_body_from_the_raw_input() {
    for vector in load_vectors() {
        assert_eq!(
            encode_formatted(&vector.input),
            vector.body,
            "{}",
            vector.name
        );
    }
}

#[test]
fn payload_built_from_properties_matches_the_vector() {
    // The same request as Phorge stores it: object-form transactionPHIDs (test request),
    // flags as booleans, unknown keys ignored.
    let vector = load_vectors()
        .into_iter()
        .find(|v| v.name == "test_true_web_ui")
        .expect("vector test_true_web_ui");
    let xactions = phids(&vector.input["transactions"]);
    let object_form: serde_json::Map<String, Value> = xactions
        .iter()
        .enumerate()
        .map(|(i, phid)| ((1000 - i).to_string(), Value::from(phid.as_str())))
        .collect();
    let properties = serde_json::json!({
        "retry": "never",
        "transactionPHIDs": object_form,
        "triggerPHIDs": phids(&vector.input["triggers"]),
        "silent": false,
        "secure": false,
        "test": true,
        "somethingNew": [1, 2],
    });
    let parsed = RequestProperties::parse(&properties.to_string()).expect("properties parse");
    let payload = WebhookPayload::from_properties(
        vector.input["object"]["phid"].as_str().expect("phid"),
        &parsed,
        vector.input["action"]["epoch"].as_u64().expect("epoch"),
    );
    let body = payload.encode_body();
    assert_eq!(String::from_utf8(body.clone()).unwrap(), vector.body);
    assert_eq!(sign(vector.key.as_bytes(), &body), vector.signature);
}
