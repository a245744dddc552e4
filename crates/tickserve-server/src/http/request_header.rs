//! A v2 request's JSON header as read, before the model is known: its
//! inputs, outputs and `parameters` objects, by serde_json here or by the
//! hand reader (`http::fast::reader`) where the header is plain JSON; the codec
//! turns either reading into the core's request.

use std::borrow::Cow;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use smallvec::SmallVec;

use tickserve_edge::MAX_TENSORS;

/// The most dimensions one input's shape may have: every front end's limit.
pub use tickserve_core::MAX_RANK;
/// The most bytes of JSON one `parameters` object may take.
pub const MAX_PARAMETER_BYTES: usize = 64 * 1024;

// Memory held while decoding stays a small multiple of the body: tensor data
// and parameters are kept as borrowed raw JSON text until the datatype is
// known, then tensor data is read straight into typed bytes (no JSON value
// tree: a tree costs tens of bytes per number); lists are capped.
#[derive(Deserialize)]
struct RequestJson<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(borrow, deserialize_with = "inputs")]
    inputs: Vec<InputJson<'a>>,
    #[serde(default, borrow, deserialize_with = "outputs")]
    outputs: Option<Vec<OutputJson<'a>>>,
}

#[derive(Deserialize)]
struct InputJson<'a> {
    name: String,
    #[serde(deserialize_with = "shape")]
    shape: Vec<i64>,
    #[serde(borrow)]
    datatype: Cow<'a, str>,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct OutputJson<'a> {
    name: String,
    #[serde(default, borrow)]
    parameters: Option<&'a RawValue>,
}

/// A request's JSON header, as serde_json or the hand reader read it.
#[derive(Default)]
pub struct Header<'a> {
    /// `id`.
    pub id: Option<String>,
    /// The request's `parameters`.
    pub parameters: Option<Params<'a>>,
    /// `inputs`.
    pub inputs: Vec<InputHeader<'a>>,
    /// `outputs`, when the request names them.
    pub outputs: Option<Vec<OutputHeader<'a>>>,
}

/// One input of a [`Header`].
pub struct InputHeader<'a> {
    /// `name`.
    pub name: String,
    /// `shape`.
    pub shape: Vec<i64>,
    /// `datatype`, as it came.
    pub datatype: Cow<'a, str>,
    /// The input's `parameters`.
    pub parameters: Option<Params<'a>>,
    /// JSON tensor `data`, kept as text until the datatype is known.
    pub data: Option<&'a RawValue>,
}

/// One output of a [`Header`].
pub struct OutputHeader<'a> {
    /// `name`.
    pub name: String,
    /// The output's `parameters`.
    pub parameters: Option<Params<'a>>,
}

/// A `parameters` object as read: serde_json's reading keeps its text, to
/// be parsed once its size is known; the hand reader reads its entries.
#[derive(Debug)]
pub enum Params<'a> {
    /// The object's text.
    Text(&'a str),
    /// The object's entries.
    Read(Entries<'a>),
}

impl<'a> From<RequestJson<'a>> for Header<'a> {
    fn from(json: RequestJson<'a>) -> Header<'a> {
        Header {
            id: json.id,
            parameters: json.parameters.map(|raw| Params::Text(raw.get())),
            inputs: json
                .inputs
                .into_iter()
                .map(|input| InputHeader {
                    name: input.name,
                    shape: input.shape,
                    datatype: input.datatype,
                    parameters: input.parameters.map(|raw| Params::Text(raw.get())),
                    data: input.data,
                })
                .collect(),
            outputs: json.outputs.map(|outputs| {
                outputs
                    .into_iter()
                    .map(|output| OutputHeader {
                        name: output.name,
                        parameters: output.parameters.map(|raw| Params::Text(raw.get())),
                    })
                    .collect()
            }),
        }
    }
}

/// A JSON list of at most `limit` entries (`what` names them in the error).
fn at_most<'de, D, T>(d: D, limit: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T> {
        limit: usize,
        what: &'static str,
        entries: PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a list of at most {} {}", self.limit, self.what)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut entries = Vec::new();
            while let Some(entry) = seq.next_element()? {
                if entries.len() == self.limit {
                    return Err(de::Error::custom(format!(
                        "more than {} {} (tickserve's limit)",
                        self.limit, self.what
                    )));
                }
                entries.push(entry);
            }
            Ok(entries)
        }
    }
    d.deserialize_seq(Bounded {
        limit,
        what,
        entries: PhantomData,
    })
}

fn inputs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<InputJson<'de>>, D::Error> {
    at_most(d, MAX_TENSORS, "inputs")
}

fn outputs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<OutputJson<'de>>>, D::Error> {
    at_most(d, MAX_TENSORS, "outputs").map(Some)
}

fn shape<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<i64>, D::Error> {
    at_most(d, MAX_RANK, "dimensions in a shape")
}

/// A `parameters` object's entries in the order they came: values parsed,
/// names borrowed from the body where they hold no escapes. A request has a
/// few (two kept inline), so a lookup searches them; the last of a repeated
/// name wins, as in a JSON object read into a map.
#[derive(Debug)]
pub struct Entries<'a>(pub SmallVec<[(Cow<'a, str>, Value); 2]>);

impl Entries<'_> {
    /// The value of `name` (the last, where it repeats).
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value)
    }
}

/// A name borrowed from the body unless it holds escapes.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

/// A `parameters` object's text read by serde_json, within
/// [`MAX_PARAMETER_BYTES`].
pub fn json_parameters(text: &str) -> Result<Entries<'_>, String> {
    struct Object;
    impl<'de> Visitor<'de> for Object {
        type Value = Entries<'de>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
            let mut entries = SmallVec::new();
            while let Some((Name(key), value)) = map.next_entry::<Name<'de>, Value>()? {
                entries.push((key, value));
            }
            Ok(Entries(entries))
        }
    }
    if text.len() > MAX_PARAMETER_BYTES {
        return Err(format!(
            "parameters take {} bytes of JSON; at most {MAX_PARAMETER_BYTES}",
            text.len()
        ));
    }
    let mut json = serde_json::Deserializer::from_str(text);
    json.deserialize_map(Object)
        .and_then(|entries| json.end().map(|()| entries))
        .map_err(|e| format!("parameters must be a JSON object: {e}"))
}

/// Reads a request's JSON header with serde_json.
pub fn json_header(text: &[u8]) -> serde_json::Result<Header<'_>> {
    serde_json::from_slice::<RequestJson>(text).map(Header::from)
}

/// A `parameters` object's entries as text: serde_json's reading of
/// its text, or the entries read by hand.
fn entries(params: &Option<Params<'_>>) -> String {
    match params {
        None => "none".to_string(),
        Some(Params::Read(entries)) => format!("{:?}", entries.0),
        Some(Params::Text(text)) => match json_parameters(text) {
            Ok(entries) => format!("{:?}", entries.0),
            Err(e) => e,
        },
    }
}

/// A header as comparable text: what the hand reader ([`super::fast::reader`])
/// and serde_json's must agree on (its unit tests and the `http_binary` fuzz
/// target hold it to that).
pub fn comparable(header: &Header<'_>) -> String {
    let inputs: Vec<String> = header
        .inputs
        .iter()
        .map(|i| {
            format!(
                "{}|{:?}|{}|{}|{:?}",
                i.name,
                i.shape,
                i.datatype,
                entries(&i.parameters),
                i.data.map(|d| d.get())
            )
        })
        .collect();
    let outputs: Option<Vec<String>> = header.outputs.as_ref().map(|list| {
        list.iter()
            .map(|o| format!("{}|{}", o.name, entries(&o.parameters)))
            .collect()
    });
    format!(
        "{:?} {} {inputs:?} {outputs:?}",
        header.id,
        entries(&header.parameters)
    )
}
