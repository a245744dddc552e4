//! TF Serving's JSON for `:predict`: the row format (`instances`) and the
//! column format (`inputs`) in, `predictions` and `outputs` out.
//!
//! Tensors carry no shape in this format: it is read from the nesting of the
//! lists (a ragged list is an error), and the element type from the model's
//! signature. Values are read straight into little-endian bytes, without a
//! JSON value tree, as the v2 codec does. `NaN`, `Infinity` and `-Infinity`
//! are accepted as bare tokens and written back the same way, as TF Serving
//! does; other floats are written as the shortest text that reads back to
//! the same value.

use std::borrow::Cow;
use std::collections::BTreeSet;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use tickserve_core::{DataType, Error, InferResponse, InputTensor, Signature, TensorSpec};

use super::{SIGNATURE_NAME, alias, check_signature, input};

/// The most dimensions a tensor may have in the JSON: every front end's limit.
pub use tickserve_core::MAX_RANK;

/// A `:predict` body.
#[derive(Deserialize)]
struct PredictJson<'a> {
    #[serde(default)]
    signature_name: Option<String>,
    #[serde(default, borrow)]
    instances: Option<&'a RawValue>,
    #[serde(default, borrow)]
    inputs: Option<&'a RawValue>,
}

/// Which format a request used, which decides the format of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `instances` in, `predictions` out.
    Row,
    /// `inputs` in, `outputs` out.
    Column,
}

/// A decoded `:predict` body.
#[derive(Debug)]
pub struct Predict {
    /// The inputs, under their ONNX names.
    pub inputs: Vec<InputTensor>,
    /// The format the answer takes.
    pub format: Format,
}

/// Decodes a `:predict` body for `model` with `signature`.
pub fn decode(model: &str, signature: &Signature, body: &[u8]) -> Result<Predict, Error> {
    let text = std::str::from_utf8(body)
        .map_err(|e| Error::request(model, format!("the body is not UTF-8 JSON: {e}")))?;
    let text = quote_non_finite(text).map_err(|message| Error::request(model, message))?;
    if let Some((signature_name, format, tensor)) = one_pass::decode(signature, &text) {
        signature_named(model, signature_name.as_deref())?;
        return Ok(Predict {
            inputs: vec![tensor],
            format,
        });
    }
    decode_in_general(model, signature, &text)
}

/// Checks the body's `signature_name` (absent: the default signature).
fn signature_named(model: &str, signature_name: Option<&str>) -> Result<(), Error> {
    let signature_name = signature_name.unwrap_or_default();
    if marked_non_finite(signature_name).is_some() {
        return Err(Error::request(
            model,
            "JSON parse error: 'signature_name' must be a string",
        ));
    }
    check_signature(model, signature_name)
}

/// Panics when [`decode`] (the one-pass reading where it answers) and the
/// general reading decode `body` differently: tensors, format or refusal
/// (the unit tests' and the `tf_json` fuzz target's check).
#[doc(hidden)]
pub fn check_one_pass(signature: &Signature, body: &[u8]) {
    let Some(quoted) = std::str::from_utf8(body)
        .ok()
        .and_then(|text| quote_non_finite(text).ok())
    else {
        return;
    };
    let show = |r: Result<Predict, Error>| match r {
        Ok(p) => format!("{:?} {:?}", p.format, p.inputs),
        Err(e) => format!("refused: {e}"),
    };
    let general = show(decode_in_general("m", signature, &quoted));
    let either = show(decode("m", signature, body));
    assert_eq!(either, general, "body {:?}", String::from_utf8_lossy(body));
}

/// [`decode`] of any body, whatever its format: the body's fields as raw
/// JSON first, then the tensors (the one-pass reading's fallback, and the
/// one that words every refusal).
fn decode_in_general(model: &str, signature: &Signature, text: &str) -> Result<Predict, Error> {
    let parsed: PredictJson = serde_json::from_str(text)
        .map_err(|e| Error::request(model, format!("JSON parse error: {e}")))?;
    signature_named(model, parsed.signature_name.as_deref())?;
    match (parsed.instances, parsed.inputs) {
        (Some(_), Some(_)) => Err(Error::request(
            model,
            "the body has both 'instances' (row format) and 'inputs' (column format); send one",
        )),
        (None, None) => Err(Error::request(
            model,
            "the body has neither 'instances' (row format) nor 'inputs' (column format)",
        )),
        (Some(rows), None) => Ok(Predict {
            inputs: decode_rows(model, signature, rows)?,
            format: Format::Row,
        }),
        (None, Some(columns)) => Ok(Predict {
            inputs: decode_columns(model, signature, columns)?,
            format: Format::Column,
        }),
    }
}

/// True when `raw` is a JSON object other than `{"b64": ...}`: a set of
/// named tensors rather than one tensor's value.
fn is_named(raw: &str) -> bool {
    if !raw.trim_start().starts_with('{') {
        return false;
    }
    let keys: Result<std::collections::BTreeMap<Cow<'_, str>, IgnoredAny>, _> =
        serde_json::from_str(raw);
    !keys.is_ok_and(|k| k.len() == 1 && k.contains_key("b64"))
}

/// The model's only input, for a request that does not name its inputs.
fn sole_input<'s>(model: &str, signature: &'s Signature) -> Result<&'s TensorSpec, Error> {
    match signature.inputs.as_slice() {
        [only] => Ok(only),
        inputs => Err(Error::request(
            model,
            format!(
                "the request gives one unnamed tensor; signature '{SIGNATURE_NAME}' has {} \
                 inputs ({}): name them (a list of objects in 'instances', or an object in \
                 'inputs')",
                inputs.len(),
                super::aliases(inputs)
            ),
        )),
    }
}

/// One input being gathered from rows: its spec, its bytes so far and the
/// shape of each row (the first row's; the others must match).
struct Gathering<'s> {
    spec: &'s TensorSpec,
    data: Vec<u8>,
    row_shape: Option<Vec<usize>>,
}

impl Gathering<'_> {
    /// Appends one row's value.
    fn push(&mut self, model: &str, row: usize, raw: &str) -> Result<(), Error> {
        let shape = read_tensor(model, self.spec, raw, &mut self.data)?;
        match &self.row_shape {
            None => self.row_shape = Some(shape),
            Some(first) if *first != shape => {
                return Err(Error::input(
                    model,
                    alias(&self.spec.name),
                    format!(
                        "every instance shaped {first:?}, as the first (a ragged tensor is not)"
                    ),
                    format!("{shape:?} in instance {row}"),
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }
}

/// The row format: a list of one input's values, or a list of objects naming
/// each input's value; every instance is one row of the batch.
fn decode_rows(
    model: &str,
    signature: &Signature,
    rows: &RawValue,
) -> Result<Vec<InputTensor>, Error> {
    let mut visitor = RowsVisitor {
        model,
        signature,
        gathering: Vec::new(),
        rows: 0,
        named: None,
        error: None,
    };
    let mut reader = serde_json::Deserializer::from_str(rows.get());
    let outcome = (&mut reader)
        .deserialize_seq(&mut visitor)
        .and_then(|()| reader.end());
    if let Some(error) = visitor.error.take() {
        return Err(error);
    }
    outcome.map_err(|e| {
        Error::request(
            model,
            format!("'instances' must be a list of instances: {}", clean(&e)),
        )
    })?;
    if visitor.rows == 0 {
        return Err(Error::request(model, "'instances' is an empty list"));
    }
    let rows = visitor.rows;
    Ok(visitor
        .gathering
        .into_iter()
        .map(|g| InputTensor {
            name: g.spec.name.clone(),
            datatype: g.spec.datatype,
            shape: std::iter::once(rows as i64)
                .chain(
                    g.row_shape
                        .unwrap_or_default()
                        .into_iter()
                        .map(|d| d as i64),
                )
                .collect(),
            data: g.data.into(),
        })
        .collect())
}

/// Walks the `instances` list one instance at a time (nothing but the typed
/// bytes is kept); the first instance decides whether instances are named.
struct RowsVisitor<'m, 's> {
    model: &'m str,
    signature: &'s Signature,
    gathering: Vec<Gathering<'s>>,
    rows: usize,
    named: Option<bool>,
    /// A request error met inside the walk (serde's error type cannot carry it).
    error: Option<Error>,
}

impl RowsVisitor<'_, '_> {
    fn row(&mut self, raw: &str) -> Result<(), Error> {
        let model = self.model;
        let row = self.rows;
        let named = *self.named.get_or_insert_with(|| is_named(raw));
        if !named {
            if self.gathering.is_empty() {
                self.gathering.push(Gathering {
                    spec: sole_input(model, self.signature)?,
                    data: Vec::new(),
                    row_shape: None,
                });
            }
            self.gathering[0].push(model, row, raw)?;
            return Ok(());
        }
        let fields: Vec<(Cow<'_, str>, &RawValue)> = named_fields(raw).map_err(|e| {
            Error::request(
                model,
                format!("instance {row} must be an object of named inputs, as the first: {e}"),
            )
        })?;
        let mut seen = BTreeSet::new();
        for (name, value) in &fields {
            let spec = input(model, self.signature, name)?;
            if !seen.insert(spec.name.as_str()) {
                return Err(Error::request(
                    model,
                    format!("instance {row} names input '{name}' twice"),
                ));
            }
            let at = match self.gathering.iter().position(|g| g.spec.name == spec.name) {
                Some(at) => at,
                None if row == 0 => {
                    self.gathering.push(Gathering {
                        spec,
                        data: Vec::new(),
                        row_shape: None,
                    });
                    self.gathering.len() - 1
                }
                None => {
                    return Err(Error::request(
                        model,
                        format!("instance {row} names input '{name}', which instance 0 does not"),
                    ));
                }
            };
            self.gathering[at].push(model, row, value.get())?;
        }
        if seen.len() != self.gathering.len() {
            return Err(Error::request(
                model,
                format!(
                    "instance {row} names {} inputs; instance 0 names {} (every instance names the same inputs)",
                    seen.len(),
                    self.gathering.len()
                ),
            ));
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for &mut RowsVisitor<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of instances")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(raw) = seq.next_element::<&RawValue>()? {
            if let Err(e) = self.row(raw.get()) {
                self.error = Some(e);
                return Err(de::Error::custom("a bad instance"));
            }
            self.rows += 1;
        }
        Ok(())
    }
}

/// The fields of a JSON object, values kept as raw text, at most one per
/// input a model may have (the v2 front end's limit).
fn named_fields(raw: &str) -> Result<Vec<(Cow<'_, str>, &RawValue)>, String> {
    struct Fields;
    impl<'de> Visitor<'de> for Fields {
        type Value = Vec<(Cow<'de, str>, &'de RawValue)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut fields = Vec::new();
            while let Some(entry) = map.next_entry::<Cow<'de, str>, &'de RawValue>()? {
                if fields.len() == tickserve_edge::MAX_TENSORS {
                    return Err(de::Error::custom(format!(
                        "more than {} named tensors (tickserve's limit)",
                        tickserve_edge::MAX_TENSORS
                    )));
                }
                fields.push(entry);
            }
            Ok(fields)
        }
    }
    let mut reader = serde_json::Deserializer::from_str(raw);
    reader
        .deserialize_map(Fields)
        .and_then(|f| reader.end().map(|()| f))
        .map_err(|e| clean(&e))
}

/// The column format: one tensor for the model's only input, or an object of
/// named tensors; each tensor's first dimension is the batch.
fn decode_columns(
    model: &str,
    signature: &Signature,
    columns: &RawValue,
) -> Result<Vec<InputTensor>, Error> {
    let tensor = |spec: &TensorSpec, raw: &str| -> Result<InputTensor, Error> {
        let mut data = Vec::new();
        let shape = read_tensor(model, spec, raw, &mut data)?;
        Ok(InputTensor {
            name: spec.name.clone(),
            datatype: spec.datatype,
            shape: shape.into_iter().map(|d| d as i64).collect(),
            data: data.into(),
        })
    };
    if !is_named(columns.get()) {
        return Ok(vec![tensor(sole_input(model, signature)?, columns.get())?]);
    }
    let fields = named_fields(columns.get()).map_err(|e| {
        Error::request(
            model,
            format!("'inputs' must be a tensor or an object of named tensors: {e}"),
        )
    })?;
    let mut inputs: Vec<InputTensor> = Vec::with_capacity(fields.len());
    for (name, raw) in &fields {
        let spec = input(model, signature, name)?;
        if inputs.iter().any(|t| t.name == spec.name) {
            return Err(Error::request(
                model,
                format!("'inputs' names input '{name}' twice"),
            ));
        }
        inputs.push(tensor(spec, raw.get())?);
    }
    Ok(inputs)
}

/// serde_json's message without its line and column (meaningless to a
/// client of a rewritten body).
fn clean(e: &serde_json::Error) -> String {
    let text = e.to_string();
    text.split(" at line ").next().unwrap_or(&text).to_string()
}

/// Reads one tensor's value (a scalar or nested lists) as `spec`'s datatype
/// into `out`, and returns its shape as the nesting gives it.
fn read_tensor(
    model: &str,
    spec: &TensorSpec,
    raw: &str,
    out: &mut Vec<u8>,
) -> Result<Vec<usize>, Error> {
    let mut state = Nesting {
        datatype: spec.datatype,
        out,
        rank: None,
        dims: Vec::new(),
        count: 0,
    };
    let mut reader = serde_json::Deserializer::from_str(raw);
    let read = NestingSeed {
        state: &mut state,
        depth: 0,
    }
    .deserialize(&mut reader)
    .and_then(|()| reader.end());
    let name = alias(&spec.name);
    let expected = || {
        format!(
            "{} values (a {} tensor, nested lists of equal length)",
            super::tf_dtype_name(super::tf_dtype(spec.datatype)),
            spec.datatype
        )
    };
    read.map_err(|e| Error::input(model, name, expected(), clean(&e)))?;
    let rank = state.rank.unwrap_or(0);
    let dims: Option<Vec<usize>> = state.dims.iter().take(rank).copied().collect();
    dims.ok_or_else(|| Error::input(model, name, expected(), "lists of unknown length"))
}

/// What a tensor's walk has learnt so far.
struct Nesting<'o> {
    datatype: DataType,
    out: &'o mut Vec<u8>,
    /// The depth of the scalars (or of the innermost empty list), once met.
    rank: Option<usize>,
    /// The length of the lists at each depth, once a list there has ended.
    dims: Vec<Option<usize>>,
    /// Elements read.
    count: usize,
}

impl Nesting<'_> {
    fn at_depth<E: de::Error>(&mut self, depth: usize) -> Result<(), E> {
        match self.rank {
            None => {
                self.rank = Some(depth);
                Ok(())
            }
            Some(rank) if rank == depth => Ok(()),
            Some(_) => Err(E::custom(format!(
                "a ragged tensor (lists nested to different depths, at element {})",
                self.count
            ))),
        }
    }

    fn scalar<E: de::Error>(&mut self, depth: usize, value: TfScalar<'_>) -> Result<(), E> {
        self.at_depth(depth)?;
        let index = self.count;
        push(self.out, self.datatype, value)
            .map_err(|what| E::custom(format!("{what} at element {index}")))?;
        self.count += 1;
        Ok(())
    }
}

/// One value inside a tensor at `depth`.
struct NestingSeed<'a, 'o> {
    state: &'a mut Nesting<'o>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for NestingSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NestingSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} values, nested in lists", self.state.datatype)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.depth >= MAX_RANK {
            return Err(de::Error::custom(format!(
                "lists nested more than {MAX_RANK} deep (tickserve's limit)"
            )));
        }
        let mut length = 0usize;
        while seq
            .next_element_seed(NestingSeed {
                state: &mut *self.state,
                depth: self.depth + 1,
            })?
            .is_some()
        {
            length += 1;
        }
        if length == 0 {
            // An empty list: the innermost level, unless deeper lists say otherwise.
            self.state.at_depth::<A::Error>(self.depth + 1)?;
        }
        let dims = &mut self.state.dims;
        if dims.len() <= self.depth {
            dims.resize(self.depth + 1, None);
        }
        match dims[self.depth] {
            None => dims[self.depth] = Some(length),
            Some(first) if first != length => {
                return Err(de::Error::custom(format!(
                    "a ragged tensor (lists of {first} and {length} elements at depth {})",
                    self.depth
                )));
            }
            Some(_) => {}
        }
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.state.scalar(self.depth, TfScalar::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.state.scalar(self.depth, TfScalar::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.state.scalar(self.depth, TfScalar::Uint(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.state.scalar(self.depth, TfScalar::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.state.scalar(self.depth, TfScalar::Text(v))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<(), E> {
        self.visit_str(v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        let index = self.state.count;
        Err(E::custom(format!("null at element {index}")))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let index = self.state.count;
        let b64 = map.next_key::<Cow<'de, str>>()?.is_some_and(|k| k == "b64");
        Err(de::Error::custom(if b64 {
            format!(
                "{{\"b64\": ...}} at element {index} (base64 carries DT_STRING values, which \
                 tickserve does not serve)"
            )
        } else {
            format!("an object at element {index}")
        }))
    }
}

/// One scalar of TF Serving's JSON: a number or a boolean, as in any JSON,
/// or a string (a non-finite token, once [`quote_non_finite`] quoted it).
#[derive(Debug, Clone, Copy)]
enum TfScalar<'a> {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Text(&'a str),
}

/// Appends `value` as `datatype`: numbers and booleans as the v2 codec reads
/// them, and TF Serving's non-finite tokens (quoted by [`quote_non_finite`])
/// as floats; the error names the value.
fn push(out: &mut Vec<u8>, datatype: DataType, value: TfScalar<'_>) -> Result<(), String> {
    use crate::scalar::{Scalar as Number, push_scalar};
    let number = match value {
        TfScalar::Bool(b) => Number::Bool(b),
        TfScalar::Int(i) => Number::Int(i),
        TfScalar::Uint(u) => Number::Uint(u),
        TfScalar::Float(x) => Number::Float(x),
        TfScalar::Text(marked) if datatype.is_float() => match marked_non_finite(marked) {
            Some((_, x)) => Number::Float(x),
            None => return Err(describe(value)),
        },
        TfScalar::Text(_) => return Err(describe(value)),
    };
    push_scalar(out, datatype, number)
}

fn describe(value: TfScalar<'_>) -> String {
    match value {
        TfScalar::Bool(b) => b.to_string(),
        TfScalar::Int(i) => i.to_string(),
        TfScalar::Uint(u) => u.to_string(),
        TfScalar::Float(x) => format_f64(x),
        TfScalar::Text(t) => match marked_non_finite(t) {
            Some((token, _)) => token.to_string(),
            None => tickserve_core::text::quote(t),
        },
    }
}

/// The bare tokens TF Serving reads as non-finite floats, with their values.
const NON_FINITE: [(&str, f64); 3] = [
    ("NaN", f64::NAN),
    ("Infinity", f64::INFINITY),
    ("-Infinity", f64::NEG_INFINITY),
];

/// What [`quote_non_finite`] marks a bare token's string with: U+0000, which
/// no client string may hold, so that a client's quoted `"NaN"` stays a
/// string (TF Serving refuses it as a float).
const MARK: char = '\0';

/// The token and value of a string [`quote_non_finite`] made of a bare token.
fn marked_non_finite(text: &str) -> Option<(&'static str, f64)> {
    let token = text.strip_prefix(MARK)?;
    NON_FINITE.into_iter().find(|(t, _)| *t == token)
}

/// The bytes [`quote_non_finite`] adds for each token it quotes: `"\u0000`
/// before it and `"` after.
const GROWTH_PER_TOKEN: usize = 8;

/// The most bytes reading `body` with [`decode`] copies beyond it: the
/// rewritten copy [`quote_non_finite`] makes when the body has bare
/// non-finite tokens, bounded from above by counting `NaN` and `Infinity`
/// wherever they appear (a fast search, no parse). 0 for a body without
/// (found in one pass for a body with no capital `N` or `I`).
pub fn expansion(body: &[u8]) -> usize {
    // Most bodies hold no capital N or I at all (numbers never do, and
    // TF Serving's keys are lower case): one pass of memchr2 says so.
    if memchr::memchr2(b'N', b'I', body).is_none() {
        return 0;
    }
    let count = |word: &[u8]| memchr::memmem::find_iter(body, word).count();
    let tokens = count(b"NaN").saturating_add(count(b"Infinity"));
    if tokens == 0 {
        return 0;
    }
    body.len()
        .saturating_add(tokens.saturating_mul(GROWTH_PER_TOKEN))
}

/// Turns the bare tokens `NaN`, `Infinity` and `-Infinity` where a value
/// stands (after `[`, `:` or an array's `,`; outside strings) into marked
/// strings (`"\u0000NaN"`, see [`MARK`]), which the decoder reads as floats;
/// the text is copied only when it has such a token. Where an object's key
/// stands (after `{` or an object's `,`) a bare token is left as it is, and
/// the JSON reader refuses it as TF Serving does. A string of the client's
/// that holds U+0000 (`\u0000`) is refused: it could pass for a marked token.
fn quote_non_finite(text: &str) -> Result<Cow<'_, str>, String> {
    let bytes = text.as_bytes();
    // Without a capital N or I the body holds no token, and no string that
    // could pass for a marked one: nothing to quote or refuse (one pass of
    // memchr2, the common body's whole cost here).
    if memchr::memchr2(b'N', b'I', bytes).is_none() {
        return Ok(Cow::Borrowed(text));
    }
    let token_at = |i: usize| -> Option<&'static str> {
        NON_FINITE
            .into_iter()
            .map(|(t, _)| t)
            .find(|t| bytes[i..].starts_with(t.as_bytes()))
    };
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut in_string = false;
    // Whether each open container is an object (a key comes after its `{`
    // and `,`), innermost last; and whether a key stands next.
    let mut objects: Vec<bool> = Vec::new();
    let mut key_next = false;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => {
                    if bytes[i + 1..].starts_with(b"u0000") {
                        return Err(
                            "a string in the body holds U+0000 (\\u0000), which TF Serving's \
                             JSON API has no use for"
                                .to_string(),
                        );
                    }
                    i += 1;
                }
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                key_next = false;
            }
            b'{' => {
                objects.push(true);
                key_next = true;
            }
            b'[' => objects.push(false),
            b']' | b'}' => {
                objects.pop();
            }
            b',' => key_next = objects.last() == Some(&true),
            b':' => key_next = false,
            b'N' | b'I' | b'-' if !key_next => {
                if let Some(token) = token_at(i) {
                    let o = out.get_or_insert_with(|| String::with_capacity(text.len() + 64));
                    o.push_str(&text[copied..i]);
                    o.push_str("\"\\u0000");
                    o.push_str(token);
                    o.push('"');
                    i += token.len();
                    copied = i;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    Ok(match out {
        None => Cow::Borrowed(text),
        Some(mut o) => {
            o.push_str(&text[copied..]);
            Cow::Owned(o)
        }
    })
}

/// Encodes an answer: `{"predictions": ...}` for a row request (one value per
/// instance; objects by output name when there are several outputs),
/// `{"outputs": ...}` for a column request (the tensor, or an object of
/// tensors).
pub fn encode(response: &InferResponse, format: Format) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        64 + response
            .outputs
            .iter()
            .map(|o| o.data.len() * 3)
            .sum::<usize>(),
    );
    let one = response.outputs.len() == 1;
    match format {
        Format::Column => {
            out.extend_from_slice(b"{\"outputs\":");
            if one {
                let o = &response.outputs[0];
                write_tensor(&mut out, o.datatype, &o.data, &dims(&o.shape));
            } else {
                out.push(b'{');
                for (i, o) in response.outputs.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_key(&mut out, alias(&o.name));
                    write_tensor(&mut out, o.datatype, &o.data, &dims(&o.shape));
                }
                out.push(b'}');
            }
            out.push(b'}');
        }
        Format::Row => {
            out.extend_from_slice(b"{\"predictions\":[");
            let rows = response
                .outputs
                .first()
                .and_then(|o| o.shape.first())
                .map_or(0, |&r| usize::try_from(r).unwrap_or(0));
            for row in 0..rows {
                if row > 0 {
                    out.push(b',');
                }
                if !one {
                    out.push(b'{');
                }
                for (i, o) in response.outputs.iter().enumerate() {
                    let shape = dims(&o.shape);
                    let row_dims = shape.get(1..).unwrap_or_default();
                    let row_bytes = row_dims.iter().product::<usize>() * o.datatype.size();
                    let slice = o
                        .data
                        .get(row * row_bytes..(row + 1) * row_bytes)
                        .unwrap_or_default();
                    if !one {
                        if i > 0 {
                            out.push(b',');
                        }
                        write_key(&mut out, alias(&o.name));
                    }
                    write_tensor(&mut out, o.datatype, slice, row_dims);
                }
                if !one {
                    out.push(b'}');
                }
            }
            out.extend_from_slice(b"]}");
        }
    }
    out
}

fn dims(shape: &[i64]) -> Vec<usize> {
    shape
        .iter()
        .map(|&d| usize::try_from(d).unwrap_or(0))
        .collect()
}

fn write_key(out: &mut Vec<u8>, key: &str) {
    // Serializing a string into a vector cannot fail.
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
}

/// Writes `data` as nested lists of `dims` (a scalar when `dims` is empty).
fn write_tensor(out: &mut Vec<u8>, datatype: DataType, data: &[u8], dims: &[usize]) {
    let size = datatype.size();
    let Some((&first, rest)) = dims.split_first() else {
        write_scalar(out, datatype, data.get(..size).unwrap_or_default());
        return;
    };
    let step = rest.iter().product::<usize>() * size;
    out.push(b'[');
    for i in 0..first {
        if i > 0 {
            out.push(b',');
        }
        let part = data.get(i * step..(i + 1) * step).unwrap_or_default();
        write_tensor(out, datatype, part, rest);
    }
    out.push(b']');
}

/// Writes one little-endian element as JSON text, straight into `out`:
/// integers and booleans as serde_json writes them, floats as the shortest
/// text that reads back as the same value (ryu, serde_json's formatter), and
/// TF Serving's tokens for the non-finite ones.
fn write_scalar(out: &mut Vec<u8>, datatype: DataType, bytes: &[u8]) {
    use serde_json::ser::{CompactFormatter, Formatter};
    macro_rules! le {
        ($t:ty) => {{
            let mut a = [0u8; size_of::<$t>()];
            if bytes.len() == a.len() {
                a.copy_from_slice(bytes);
            }
            <$t>::from_le_bytes(a)
        }};
    }
    let mut f = CompactFormatter;
    // Writing into a vector cannot fail.
    let _ = match datatype {
        DataType::Bool => f.write_bool(out, bytes.first().is_some_and(|&b| b != 0)),
        DataType::Uint8 => f.write_u8(out, le!(u8)),
        DataType::Uint16 => f.write_u16(out, le!(u16)),
        DataType::Uint32 => f.write_u32(out, le!(u32)),
        DataType::Uint64 => f.write_u64(out, le!(u64)),
        DataType::Int8 => f.write_i8(out, le!(i8)),
        DataType::Int16 => f.write_i16(out, le!(i16)),
        DataType::Int32 => f.write_i32(out, le!(i32)),
        DataType::Int64 => f.write_i64(out, le!(i64)),
        DataType::Fp32 => match le!(f32) {
            x if x.is_finite() => f.write_f32(out, x),
            x => f.write_raw_fragment(out, non_finite(x.is_nan(), x.is_sign_positive())),
        },
        DataType::Fp64 => match le!(f64) {
            x if x.is_finite() => f.write_f64(out, x),
            x => f.write_raw_fragment(out, non_finite(x.is_nan(), x.is_sign_positive())),
        },
    };
}

/// `x` as an error message shows it (TF Serving's tokens for the non-finite).
fn format_f64(x: f64) -> String {
    if x.is_finite() {
        serde_json::to_string(&x).unwrap_or_default()
    } else {
        non_finite(x.is_nan(), x.is_sign_positive()).to_string()
    }
}

const fn non_finite(nan: bool, positive: bool) -> &'static str {
    match (nan, positive) {
        (true, _) => "NaN",
        (false, true) => "Infinity",
        (false, false) => "-Infinity",
    }
}

mod fast;

use fast::one_pass;

#[cfg(test)]
mod tests;
