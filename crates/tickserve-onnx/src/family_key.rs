//! Family keys: models whose graphs are identical except for the values of
//! their weights share a key, and later one compiled graph per bucket.
//!
//! The key hashes the graph's structure — opset imports, inputs and outputs
//! (names, element types, declared dimensions), every node in order (operator,
//! domain, input and output names, attributes), and every weight's name, element
//! type and dimensions — but not the weights' values. Attribute values, tensors
//! included (a `Constant` node's value is part of the computation), are hashed
//! in full. The bytes hashed are a fixed, length-prefixed encoding of the parsed
//! model, so the key does not depend on how the file was serialized.

use prost::Message;
use sha2::{Digest, Sha256};

use crate::proto;

/// Writes length-prefixed fields into a SHA-256.
struct KeyWriter(Sha256);

impl KeyWriter {
    fn bytes(&mut self, b: &[u8]) {
        self.0.update((b.len() as u64).to_le_bytes());
        self.0.update(b);
    }

    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn int(&mut self, v: i64) {
        self.0.update(v.to_le_bytes());
    }

    fn value_info(&mut self, v: &proto::ValueInfoProto) {
        self.str(v.name());
        // The type, encoded as protobuf: element type and declared shape.
        self.bytes(
            &v.r#type
                .as_ref()
                .map(Message::encode_to_vec)
                .unwrap_or_default(),
        );
    }
}

/// The family key of `model`: 16 hex digits of a SHA-256 over its structure.
pub fn family_key(model: &proto::ModelProto) -> String {
    let mut w = KeyWriter(Sha256::new());
    w.str("tickserve-family-v1");
    for opset in &model.opset_import {
        w.str(opset.domain());
        w.int(opset.version());
    }
    if let Some(graph) = &model.graph {
        w.str("inputs");
        for v in &graph.input {
            w.value_info(v);
        }
        w.str("outputs");
        for v in &graph.output {
            w.value_info(v);
        }
        w.str("weights");
        for t in &graph.initializer {
            w.str(t.name());
            w.int(t.data_type().into());
            for &d in &t.dims {
                w.int(d);
            }
        }
        w.str("nodes");
        for n in &graph.node {
            w.str(n.op_type());
            w.str(n.domain());
            for i in &n.input {
                w.str(i);
            }
            w.str("->");
            for o in &n.output {
                w.str(o);
            }
            for a in &n.attribute {
                // Attributes whole: names, types and values (scalars, lists,
                // tensors and subgraphs are all part of the computation).
                w.bytes(&a.encode_to_vec());
            }
        }
    }
    let digest = w.0.finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}
