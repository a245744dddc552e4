//! The v2 JSON header of the common shape, read by hand: what a client of
//! the binary extension sends (`{"inputs":[{"name":…,"shape":[…],
//! "datatype":…,"parameters":{"binary_data_size":…}}],"parameters":{…}}`).
//!
//! Only plain JSON is read here: strings without escapes, integers, `true`,
//! `false` and `null` as parameter values, each known key at most once, no
//! `data` (JSON tensor data), no unknown keys. Anything else, and anything
//! malformed, reads as `None`, and serde_json reads the body instead (with
//! its errors): so what is read here is what serde_json reads from the same
//! text (`tests` below check it on real headers and their mutations).

use std::borrow::Cow;

use serde_json::{Number, Value};
use smallvec::SmallVec;

use super::super::request_header::{
    Entries, Header, InputHeader, MAX_PARAMETER_BYTES, MAX_RANK, OutputHeader, Params,
};
use tickserve_edge::MAX_TENSORS;
use tickserve_edge::params;

/// The parameters a request's, an input's or an output's `parameters`
/// usually hold, matched in place (any other is read as a string).
const PARAMETER_KEYS: [&[u8]; 8] = [
    params::BINARY_DATA_SIZE.as_bytes(),
    params::BINARY_DATA_OUTPUT.as_bytes(),
    params::BINARY_DATA.as_bytes(),
    params::SEQUENCE_ID.as_bytes(),
    params::SEQUENCE_START.as_bytes(),
    params::SEQUENCE_END.as_bytes(),
    params::PRIORITY.as_bytes(),
    params::TIMEOUT.as_bytes(),
];

/// Reads `text` as a request header of the common shape.
pub fn header(text: &[u8]) -> Option<Header<'_>> {
    let mut json = Plain::new(text);
    let mut header = Header::default();
    let (mut id, mut parameters, mut inputs, mut outputs) = (false, false, false, false);
    let keys: [&[u8]; 4] = [b"inputs", b"parameters", b"outputs", b"id"];
    json.known_object(&keys, |json, key| {
        match key {
            b"id" if !std::mem::replace(&mut id, true) => {
                header.id = Some(json.string()?.to_owned());
            }
            b"parameters" if !std::mem::replace(&mut parameters, true) => {
                header.parameters = Some(Params::Read(json.parameters()?));
            }
            b"inputs" if !std::mem::replace(&mut inputs, true) => {
                json.list(|json| {
                    if header.inputs.len() == MAX_TENSORS {
                        return None;
                    }
                    header.inputs.push(input(json)?);
                    Some(())
                })?;
            }
            b"outputs" if !std::mem::replace(&mut outputs, true) => {
                let mut list = Vec::new();
                json.list(|json| {
                    if list.len() == MAX_TENSORS {
                        return None;
                    }
                    list.push(output(json)?);
                    Some(())
                })?;
                header.outputs = Some(list);
            }
            _ => return None,
        }
        Some(())
    })?;
    json.space();
    // `inputs` is required; trailing text is an error.
    (inputs && json.at == json.text.len()).then_some(header)
}

/// One input: name, shape, datatype, and parameters if any.
fn input<'a>(json: &mut Plain<'a>) -> Option<InputHeader<'a>> {
    let (mut name, mut shape, mut datatype, mut parameters) = (None, None, None, None);
    let keys: [&[u8]; 4] = [b"name", b"shape", b"datatype", b"parameters"];
    json.known_object(&keys, |json, key| {
        match key {
            b"name" if name.is_none() => name = Some(json.string()?.to_owned()),
            b"shape" if shape.is_none() => {
                let mut dims = Vec::new();
                json.list(|json| {
                    if dims.len() == MAX_RANK {
                        return None;
                    }
                    match json.integer()? {
                        Integer::Negative(dim) => dims.push(dim),
                        Integer::Positive(dim) => dims.push(i64::try_from(dim).ok()?),
                    }
                    Some(())
                })?;
                shape = Some(dims);
            }
            b"datatype" if datatype.is_none() => datatype = Some(json.string()?),
            b"parameters" if parameters.is_none() => {
                parameters = Some(Params::Read(json.parameters()?));
            }
            _ => return None,
        }
        Some(())
    })?;
    Some(InputHeader {
        name: name?,
        shape: shape?,
        datatype: Cow::Borrowed(datatype?),
        parameters,
        data: None,
    })
}

/// One output asked for: name, and parameters if any.
fn output<'a>(json: &mut Plain<'a>) -> Option<OutputHeader<'a>> {
    let (mut name, mut parameters) = (None, None);
    let keys: [&[u8]; 2] = [b"name", b"parameters"];
    json.known_object(&keys, |json, key| {
        match key {
            b"name" if name.is_none() => name = Some(json.string()?.to_owned()),
            b"parameters" if parameters.is_none() => {
                parameters = Some(Params::Read(json.parameters()?));
            }
            _ => return None,
        }
        Some(())
    })?;
    Some(OutputHeader {
        name: name?,
        parameters,
    })
}

/// Reads the text of a `parameters` object as its entries, where every
/// value is plain (a string without escapes, an integer, `true`, `false`,
/// `null`) and it is within the parameter limit.
pub fn parameters(text: &str) -> Option<Entries<'_>> {
    let mut json = Plain::new(text.as_bytes());
    let entries = json.parameters()?;
    json.space();
    (json.at == json.text.len()).then_some(entries)
}

/// An integer as serde_json reads one: non-negative ones as `u64`.
enum Integer {
    Negative(i64),
    Positive(u64),
}

/// A cursor over plain JSON. The text is not checked as UTF-8 as a whole:
/// outside strings only ASCII is JSON, and each string read is checked (as
/// serde_json checks them).
struct Plain<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Plain<'a> {
    fn new(text: &'a [u8]) -> Plain<'a> {
        Plain { text, at: 0 }
    }

    /// Skips JSON whitespace.
    fn space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.text.get(self.at) {
            self.at += 1;
        }
    }

    /// Takes `byte`, after whitespace if any.
    fn eat(&mut self, byte: u8) -> Option<()> {
        if self.text.get(self.at) != Some(&byte) {
            self.space();
            if self.text.get(self.at) != Some(&byte) {
                return None;
            }
        }
        self.at += 1;
        Some(())
    }

    /// Whether `byte` follows whitespace (taken if so).
    fn next_is(&mut self, byte: u8) -> bool {
        self.eat(byte).is_some()
    }

    /// A string without escapes or control characters, as its bytes and
    /// whether they are all ASCII (a key is compared with known ones as
    /// bytes, unchecked).
    fn raw_string(&mut self) -> Option<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let start = self.at;
        let rest = self.text.get(start..)?;
        let (len, ascii) = special(rest)?;
        if rest[len] != b'"' {
            return None;
        }
        self.at = start + len + 1;
        Some((&rest[..len], ascii))
    }

    /// A string without escapes or control characters.
    fn string(&mut self) -> Option<&'a str> {
        let (bytes, ascii) = self.raw_string()?;
        utf8(bytes, ascii)
    }

    /// `word` (`true`, `false`, `null`), read as `value`.
    fn word(&mut self, word: &str, value: Value) -> Option<Value> {
        let end = self.at.checked_add(word.len())?;
        (self.text.get(self.at..end)? == word.as_bytes()).then(|| {
            self.at = end;
            value
        })
    }

    /// An integer: an optional minus, then `0` or digits without a leading
    /// zero, not followed by a fraction or exponent; `None` past 18 digits
    /// (serde_json reads larger ones in wider types).
    fn integer(&mut self) -> Option<Integer> {
        self.space();
        let negative = self.text.get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(&digit @ b'0'..=b'9') = self.text.get(self.at) {
            value = value * 10 + u64::from(digit - b'0');
            self.at += 1;
            if self.at - start > 18 {
                return None;
            }
        }
        let digits = self.at - start;
        if digits == 0 || (digits > 1 && self.text[start] == b'0') {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.text.get(self.at) {
            return None;
        }
        if negative {
            // 18 digits fit. serde_json reads -0 as a float.
            let value = i64::try_from(value).ok().filter(|&v| v != 0)?;
            Some(Integer::Negative(-value))
        } else {
            Some(Integer::Positive(value))
        }
    }

    /// An object, each key given to `member` to read its value. A key of
    /// `keys` (those the object usually holds) written as is (`"name":`, no
    /// space before its colon) is matched in place; any other is read as a
    /// string first.
    fn known_object(
        &mut self,
        keys: &[&'static [u8]],
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        if self.next_is(b'}') {
            return Some(());
        }
        loop {
            self.space();
            let key = match self.key_in_place(keys) {
                Some(key) => key,
                None => {
                    let (key, _) = self.raw_string()?;
                    self.eat(b':')?;
                    key
                }
            };
            member(self, key)?;
            if self.next_is(b',') {
                continue;
            }
            return self.eat(b'}');
        }
    }

    /// The one of `keys` written next as `"key":`, taken with its colon.
    fn key_in_place(&mut self, keys: &[&'static [u8]]) -> Option<&'static [u8]> {
        let rest = self.text.get(self.at..)?;
        let (&b'"', name) = rest.split_first()? else {
            return None;
        };
        let first = *name.first()?;
        let key = keys.iter().find(|key| {
            key.first() == Some(&first)
                && name.get(key.len()..key.len() + 2) == Some(b"\":")
                && name.starts_with(key)
        })?;
        self.at += key.len() + 3;
        Some(key)
    }

    /// A list, each entry read by `entry`.
    fn list(&mut self, mut entry: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.next_is(b']') {
            return Some(());
        }
        loop {
            entry(self)?;
            if self.next_is(b',') {
                continue;
            }
            return self.eat(b']');
        }
    }

    /// A `parameters` object of plain values, within the parameter limit.
    fn parameters(&mut self) -> Option<Entries<'a>> {
        self.space();
        let start = self.at;
        let mut entries = SmallVec::new();
        self.known_object(&PARAMETER_KEYS, |json, key| {
            let key = utf8(key, key.is_ascii())?;
            json.space();
            let value = match json.text.get(json.at)? {
                b'"' => Value::String(json.string()?.to_owned()),
                b't' => json.word("true", Value::Bool(true))?,
                b'f' => json.word("false", Value::Bool(false))?,
                b'n' => json.word("null", Value::Null)?,
                _ => match json.integer()? {
                    Integer::Negative(n) => Value::Number(Number::from(n)),
                    Integer::Positive(n) => Value::Number(Number::from(n)),
                },
            };
            entries.push((Cow::Borrowed(key), value));
            Some(())
        })?;
        (self.at - start <= MAX_PARAMETER_BYTES).then_some(Entries(entries))
    }
}

/// `bytes` as text, where they are UTF-8; `ascii` says they are ASCII.
fn utf8(bytes: &[u8], ascii: bool) -> Option<&str> {
    if ascii {
        // SAFETY: ASCII is UTF-8 (`special` saw no byte with its high bit
        // set, or `is_ascii` said so).
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// A quote, backslash or control character.
fn special_byte(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// Where the first quote, backslash or control character of `bytes` is,
/// eight bytes at a time (as serde_json looks for escapes), and whether the
/// bytes before it are ASCII.
fn special(bytes: &[u8]) -> Option<(usize, bool)> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut at = 0;
    let mut high = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_le_bytes(word);
        let hits = zero(word ^ (ONES * u64::from(b'"')))
            | zero(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGHS);
        if hits != 0 {
            // The bytes before the first hit: those below its lowest bit.
            let first = hits.trailing_zeros() as usize / 8;
            let before = (1u64 << (first * 8)).wrapping_sub(1);
            high |= word & before & HIGHS;
            return Some((at + first, high == 0));
        }
        high |= word & HIGHS;
        at += 8;
    }
    let rest = &bytes[at..];
    let len = rest.iter().position(|&b| special_byte(b))?;
    Some((at + len, high == 0 && rest[..len].is_ascii()))
}

#[cfg(test)]
mod tests;
