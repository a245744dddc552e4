//! tickserve's shared-memory protocol: the fixed binary layout of a request
//! and of its answer, as they sit in an iceoryx2 sample (docs/shm.md).
//!
//! Little-endian throughout; every block starts 8-byte aligned, so a
//! tensor's data can be read in place as its element type. A request:
//!
//! ```text
//! header (32 bytes)
//!   0  magic       "TSQ2"
//!   4  kind        u8   1 lookup, 2 infer
//!   5  flags       u8   0, or 1 (FLAG_PARAMETERS) on an infer request that
//!                       carries a parameter block; other bits are refused
//!   6  count       u16  tensors that follow (infer)
//!   8  request_id  u64  echoed in the answer
//!  16  handle      u64  the model handle a lookup returned (infer)
//!  24  timeout_us  u32  the request's deadline from now; 0 none
//!  28  reserved    u32  0
//! lookup body: name_len u16, version_len u16, 4 zero bytes, name, version (padded to 8)
//! infer body:  the parameter block (when flags has FLAG_PARAMETERS), then `count` tensors
//! ```
//!
//! The parameter block (version 1): the request's v2 parameters (`priority`,
//! `sequence_id`, `sequence_start`, `mc_samples`, ...), typed as gRPC's
//! `InferParameter` is. A client that sends none sets no flag and writes no
//! block, so a request from a client older than the block reads as it did.
//!
//! ```text
//! block header (8 bytes)
//!   0  version   u8   1
//!   1  reserved  u8   0
//!   2  count     u16  parameters that follow (at most MAX_PARAMETERS)
//!   4  reserved  u32  0
//! a parameter
//!   0  name_len  u16
//!   2  kind      u8   1 bool, 2 int64, 3 uint64, 4 double, 5 string
//!   3  reserved  u8   0
//!   4  value_len u32  8, or a string's bytes (at most MAX_PARAMETER_BYTES)
//!   8  name      name_len bytes, padded to 8
//!      value     value_len bytes, padded to 8 (bool: 0 or 1 in the first byte;
//!                numbers little-endian; a string UTF-8)
//! ```
//!
//! A tensor:
//!
//! ```text
//!   0  name_len  u16
//!   2  datatype  u8   Triton's TYPE_* numbers: 1 BOOL, 2 UINT8 .. 5 UINT64, 6 INT8 .. 9 INT64, 11 FP32, 12 FP64
//!   3  ndims     u8
//!   4  reserved  u32  0
//!   8  data_len  u64
//!  16  dims      i64 × ndims
//!      name      name_len bytes, padded to 8
//!      data      data_len bytes, padded to 8
//! ```
//!
//! An answer:
//!
//! ```text
//! header (32 bytes)
//!   0  magic       "TSA2"
//!   4  kind        u8   1 lookup, 2 infer, 3 error
//!   5  error       u8   0, or the error's kind (see [`ErrorCode`])
//!   6  count       u16  tensors that follow
//!   8  request_id  u64
//! lookup:
//!  16  handle      u64  the model's handle
//!  24  reserved    u32  0
//!  28  inputs      u32  how many of the tensors are inputs
//! infer:
//!  16  reserved    u32  0
//!  20  queue_us    u32  time in the model's queue
//!  24  compute_us  u32  copying in, running, copying out
//!  28  reserved    u32  0
//! lookup body: the model's inputs then outputs, as tensors without data whose dims
//!              are the protocol shape (-1 for the batch)
//! infer body:  the outputs
//! error body:  message_len u32, 4 zero bytes, message (UTF-8, padded to 8)
//! ```

use thiserror::Error;

/// The first bytes of a request (version 2: 64-bit handles).
pub const REQUEST_MAGIC: [u8; 4] = *b"TSQ2";
/// The first bytes of an answer.
pub const ANSWER_MAGIC: [u8; 4] = *b"TSA2";
/// Bytes of either header.
pub const HEADER_BYTES: usize = 32;
/// The most tensors one request or answer carries.
pub const MAX_TENSORS: usize = 256;
/// The most dimensions one tensor has: every front end's limit.
pub use tickserve_core::MAX_RANK;
/// The longest tensor or model name, and version, in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// The header flag of an infer request that carries a parameter block.
pub const FLAG_PARAMETERS: u8 = 1;
/// The parameter block's version.
pub const PARAMETERS_VERSION: u8 = 1;
/// The most parameters one request carries.
pub const MAX_PARAMETERS: usize = 64;
/// The longest parameter name or string value, in bytes.
pub const MAX_PARAMETER_BYTES: usize = 1024;

/// A request parameter's value, typed as gRPC's `InferParameter` is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamValue<'a> {
    /// `bool_param`.
    Bool(bool),
    /// `int64_param`.
    Int(i64),
    /// `uint64_param`.
    Uint(u64),
    /// `double_param`.
    Double(f64),
    /// `string_param`.
    Str(&'a str),
}

/// One request parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Parameter<'a> {
    /// Its name (`priority`, `sequence_id`, ...).
    pub name: &'a str,
    /// Its value.
    pub value: ParamValue<'a>,
}

impl ParamValue<'_> {
    /// The kind byte and the value's bytes on the wire.
    fn encode(&self) -> (u8, std::borrow::Cow<'_, [u8]>) {
        use std::borrow::Cow;
        match *self {
            ParamValue::Bool(b) => (1, Cow::Owned(u64::from(b).to_le_bytes().to_vec())),
            ParamValue::Int(i) => (2, Cow::Owned(i.to_le_bytes().to_vec())),
            ParamValue::Uint(u) => (3, Cow::Owned(u.to_le_bytes().to_vec())),
            ParamValue::Double(x) => (4, Cow::Owned(x.to_le_bytes().to_vec())),
            ParamValue::Str(s) => (5, Cow::Borrowed(s.as_bytes())),
        }
    }
}

impl Parameter<'_> {
    fn len(&self) -> usize {
        let value_len = match self.value {
            ParamValue::Str(s) => s.len(),
            _ => 8,
        };
        8usize
            .saturating_add(pad8(self.name.len()))
            .saturating_add(pad8(value_len))
    }
}

/// Datatype numbers (Triton's `TYPE_*`) and the protocol's names for them.
const DATATYPES: [(u8, &str); 14] = [
    (1, "BOOL"),
    (2, "UINT8"),
    (3, "UINT16"),
    (4, "UINT32"),
    (5, "UINT64"),
    (6, "INT8"),
    (7, "INT16"),
    (8, "INT32"),
    (9, "INT64"),
    (10, "FP16"),
    (11, "FP32"),
    (12, "FP64"),
    (13, "BYTES"),
    (14, "BF16"),
];

/// The name of datatype number `code` (`11` → `FP32`).
pub fn datatype_name(code: u8) -> Option<&'static str> {
    DATATYPES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// The number of datatype `name` (`FP32` → `11`).
pub fn datatype_code(name: &str) -> Option<u8> {
    DATATYPES.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
}

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// A model's handle and signature, by name.
    Lookup = 1,
    /// A prediction, by handle.
    Infer = 2,
}

/// The kind of an error answer: the same classes as the other front ends'
/// (gRPC codes, HTTP statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The request is wrong (INVALID_ARGUMENT, 400).
    InvalidArgument = 1,
    /// No such model or handle (NOT_FOUND, 404).
    NotFound = 2,
    /// The request is larger than the server accepts (413).
    PayloadTooLarge = 3,
    /// The model or server cannot serve now (UNAVAILABLE, 503).
    Unavailable = 4,
    /// At capacity; retry later (RESOURCE_EXHAUSTED, 429).
    ResourceExhausted = 5,
    /// The deadline passed before the request was computed (504).
    DeadlineExceeded = 6,
    /// A failure inside the server (INTERNAL, 500).
    Internal = 7,
    /// The server's settings do not allow it (FAILED_PRECONDITION, 403).
    FailedPrecondition = 8,
    /// The model's answer broke one of its guards and is withheld
    /// (OUT_OF_RANGE, 422).
    Withheld = 9,
}

impl ErrorCode {
    /// The code of byte `b`.
    pub fn from_byte(b: u8) -> Option<ErrorCode> {
        Some(match b {
            1 => ErrorCode::InvalidArgument,
            2 => ErrorCode::NotFound,
            3 => ErrorCode::PayloadTooLarge,
            4 => ErrorCode::Unavailable,
            5 => ErrorCode::ResourceExhausted,
            6 => ErrorCode::DeadlineExceeded,
            7 => ErrorCode::Internal,
            8 => ErrorCode::FailedPrecondition,
            9 => ErrorCode::Withheld,
            _ => return None,
        })
    }

    /// Its name, as gRPC spells the code (`INVALID_ARGUMENT`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::Unavailable => "UNAVAILABLE",
            ErrorCode::ResourceExhausted => "RESOURCE_EXHAUSTED",
            ErrorCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::FailedPrecondition => "FAILED_PRECONDITION",
            ErrorCode::Withheld => "OUT_OF_RANGE",
        }
    }
}

/// A malformed request or answer: what was wrong, where.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("malformed shared-memory message: {0}")]
pub struct ProtocolError(pub String);

fn bad<T>(what: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(what.into()))
}

/// One tensor, borrowed from a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its datatype's number (Triton's TYPE_*).
    pub datatype: u8,
    /// Its shape.
    pub dims: Vec<i64>,
    /// Its data, little-endian, row-major.
    pub data: &'a [u8],
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request<'a> {
    /// A model's handle, by name and version (empty: the default).
    Lookup {
        /// Echoed in the answer.
        request_id: u64,
        /// The model.
        name: &'a str,
        /// Its version; empty for the default.
        version: &'a str,
    },
    /// A prediction.
    Infer {
        /// Echoed in the answer.
        request_id: u64,
        /// The model's handle.
        handle: u64,
        /// The deadline from now, in microseconds; 0 none.
        timeout_us: u32,
        /// The request's parameters (none without a parameter block).
        parameters: Vec<Parameter<'a>>,
        /// The inputs.
        inputs: Vec<TensorRef<'a>>,
    },
}

/// A decoded answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedAnswer<'a> {
    /// A model's handle and signature.
    Lookup {
        /// The request's id.
        request_id: u64,
        /// The handle to infer with.
        handle: u64,
        /// The inputs (dims: -1 for the batch), no data.
        inputs: Vec<TensorRef<'a>>,
        /// The outputs, likewise.
        outputs: Vec<TensorRef<'a>>,
    },
    /// A prediction.
    Infer {
        /// The request's id.
        request_id: u64,
        /// Microseconds in the model's queue.
        queue_us: u32,
        /// Microseconds of compute.
        compute_us: u32,
        /// The outputs.
        outputs: Vec<TensorRef<'a>>,
    },
    /// Why there is no prediction.
    Error {
        /// The request's id (0 when the request could not be read).
        request_id: u64,
        /// Its class.
        code: ErrorCode,
        /// What was wrong, naming the model and the input.
        message: &'a str,
    },
}

/// `n` rounded up to a multiple of 8 (saturating: lengths come from clients).
const fn pad8(n: usize) -> usize {
    n.saturating_add(7) & !7
}

/// Bytes one tensor takes.
pub fn tensor_len(name: &str, ndims: usize, data_len: usize) -> usize {
    16usize
        .saturating_add(8usize.saturating_mul(ndims))
        .saturating_add(pad8(name.len()))
        .saturating_add(pad8(data_len))
}

/// A cursor over a message, every read checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], ProtocolError> {
        match self.at.checked_add(len) {
            Some(end) if end <= self.bytes.len() => {
                let slice = &self.bytes[self.at..end];
                self.at = end;
                Ok(slice)
            }
            _ => bad(format!(
                "{len} bytes wanted at offset {} of a {}-byte message",
                self.at,
                self.bytes.len()
            )),
        }
    }

    fn padded(&mut self, len: usize) -> Result<&'a [u8], ProtocolError> {
        let slice = self.take(len)?;
        self.take(pad8(len) - len)?;
        Ok(slice)
    }

    fn u8(&mut self) -> Result<u8, ProtocolError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, ProtocolError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, ProtocolError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn str(&mut self, len: usize, what: &str) -> Result<&'a str, ProtocolError> {
        if len > MAX_NAME_BYTES {
            return bad(format!("{what} of {len} bytes; at most {MAX_NAME_BYTES}"));
        }
        std::str::from_utf8(self.padded(len)?).or_else(|_| bad(format!("{what} is not UTF-8")))
    }

    fn parameters(&mut self) -> Result<Vec<Parameter<'a>>, ProtocolError> {
        let version = self.u8()?;
        if version != PARAMETERS_VERSION {
            return bad(format!(
                "parameter block version {version}; this server reads version {PARAMETERS_VERSION}"
            ));
        }
        self.u8()?;
        let count = usize::from(self.u16()?);
        self.u32()?;
        if count > MAX_PARAMETERS {
            return bad(format!("{count} parameters; at most {MAX_PARAMETERS}"));
        }
        let mut parameters = Vec::with_capacity(count);
        for _ in 0..count {
            let name_len = usize::from(self.u16()?);
            let kind = self.u8()?;
            self.u8()?;
            let value_len = self.u32()? as usize;
            if name_len > MAX_PARAMETER_BYTES || value_len > MAX_PARAMETER_BYTES {
                return bad(format!(
                    "a parameter name or value of more than {MAX_PARAMETER_BYTES} bytes"
                ));
            }
            let name = std::str::from_utf8(self.padded(name_len)?)
                .or_else(|_| bad("a parameter name that is not UTF-8"))?;
            let bytes = self.padded(value_len)?;
            let word = || -> Result<[u8; 8], ProtocolError> {
                bytes.try_into().or_else(|_| {
                    bad(format!(
                        "parameter {name}: a number of {value_len} bytes; 8 expected"
                    ))
                })
            };
            let value = match kind {
                1 => ParamValue::Bool(u64::from_le_bytes(word()?) != 0),
                2 => ParamValue::Int(i64::from_le_bytes(word()?)),
                3 => ParamValue::Uint(u64::from_le_bytes(word()?)),
                4 => ParamValue::Double(f64::from_le_bytes(word()?)),
                5 => {
                    ParamValue::Str(std::str::from_utf8(bytes).or_else(|_| {
                        bad(format!("parameter {name}: a string that is not UTF-8"))
                    })?)
                }
                other => {
                    return bad(format!(
                        "parameter {name}: kind {other}; 1 bool, 2 int64, 3 uint64, 4 double, 5 string"
                    ));
                }
            };
            parameters.push(Parameter { name, value });
        }
        Ok(parameters)
    }

    fn tensors(&mut self, count: usize) -> Result<Vec<TensorRef<'a>>, ProtocolError> {
        if count > MAX_TENSORS {
            return bad(format!("{count} tensors; at most {MAX_TENSORS}"));
        }
        let mut tensors = Vec::with_capacity(count);
        for _ in 0..count {
            let name_len = usize::from(self.u16()?);
            let datatype = self.u8()?;
            let ndims = usize::from(self.u8()?);
            self.u32()?;
            let data_len = usize::try_from(self.u64()?).unwrap_or(usize::MAX);
            if ndims > MAX_RANK {
                return bad(format!(
                    "a tensor of {ndims} dimensions; at most {MAX_RANK}"
                ));
            }
            let mut dims = Vec::with_capacity(ndims);
            for _ in 0..ndims {
                dims.push(self.u64()? as i64);
            }
            let name = self.str(name_len, "a tensor name")?;
            let data = self.padded(data_len)?;
            tensors.push(TensorRef {
                name,
                datatype,
                dims,
                data,
            });
        }
        Ok(tensors)
    }
}

/// Reads a request.
pub fn parse_request(bytes: &[u8]) -> Result<Request<'_>, ProtocolError> {
    let mut r = Reader { bytes, at: 0 };
    match r.take(4)? {
        magic if magic == REQUEST_MAGIC => {}
        b"TSQ1" => {
            return bad(
                "a request of the shared-memory protocol's version 1; this server speaks \
                 version 2 (64-bit model handles): update the client",
            );
        }
        _ => return bad("not a tickserve request (magic)"),
    }
    let kind = r.u8()?;
    let flags = r.u8()?;
    let count = usize::from(r.u16()?);
    let request_id = r.u64()?;
    let handle = r.u64()?;
    let timeout_us = r.u32()?;
    r.u32()?;
    let known = if kind == RequestKind::Infer as u8 {
        FLAG_PARAMETERS
    } else {
        0
    };
    if flags & !known != 0 {
        return bad(format!(
            "header flags {flags:#04x}; this server knows {known:#04x} for request kind {kind}"
        ));
    }
    match kind {
        1 => {
            let name_len = usize::from(r.u16()?);
            let version_len = usize::from(r.u16()?);
            r.u32()?;
            let name = r.str(name_len, "the model name")?;
            let version = r.str(version_len, "the version")?;
            Ok(Request::Lookup {
                request_id,
                name,
                version,
            })
        }
        2 => {
            let parameters = if flags & FLAG_PARAMETERS != 0 {
                r.parameters()?
            } else {
                Vec::new()
            };
            Ok(Request::Infer {
                request_id,
                handle,
                timeout_us,
                parameters,
                inputs: r.tensors(count)?,
            })
        }
        other => bad(format!("request kind {other}; 1 (lookup) or 2 (infer)")),
    }
}

/// The request id of a message too broken to parse, if its header is there.
pub fn request_id_of(bytes: &[u8]) -> u64 {
    bytes
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Reads an answer.
pub fn parse_answer(bytes: &[u8]) -> Result<DecodedAnswer<'_>, ProtocolError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4)? != ANSWER_MAGIC {
        return bad("not a tickserve answer (magic)");
    }
    let kind = r.u8()?;
    let error = r.u8()?;
    let count = usize::from(r.u16()?);
    let request_id = r.u64()?;
    let fields = r.take(16)?;
    let word = |at: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&fields[at..at + 4]);
        u32::from_le_bytes(b)
    };
    let handle = u64::from(word(0)) | (u64::from(word(4)) << 32);
    let (queue_us, compute_us, inputs) = (word(4), word(8), word(12) as usize);
    match kind {
        1 => {
            let mut tensors = r.tensors(count)?;
            if inputs > tensors.len() {
                return bad("more inputs than tensors");
            }
            let outputs = tensors.split_off(inputs);
            Ok(DecodedAnswer::Lookup {
                request_id,
                handle,
                inputs: tensors,
                outputs,
            })
        }
        2 => Ok(DecodedAnswer::Infer {
            request_id,
            queue_us,
            compute_us,
            outputs: r.tensors(count)?,
        }),
        3 => {
            let code = ErrorCode::from_byte(error)
                .ok_or_else(|| ProtocolError(format!("error code {error}")))?;
            let len = r.u32()? as usize;
            r.u32()?;
            let message = std::str::from_utf8(r.padded(len)?)
                .map_err(|_| ProtocolError("an error message that is not UTF-8".into()))?;
            Ok(DecodedAnswer::Error {
                request_id,
                code,
                message,
            })
        }
        other => bad(format!("answer kind {other}")),
    }
}

/// A tensor to write: name, datatype number, dims, data.
#[derive(Debug, Clone, Copy)]
pub struct TensorOut<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its datatype's number.
    pub datatype: u8,
    /// Its shape.
    pub dims: &'a [i64],
    /// Its data.
    pub data: &'a [u8],
}

impl TensorOut<'_> {
    fn len(&self) -> usize {
        tensor_len(self.name, self.dims.len(), self.data.len())
    }
}

/// Writes into a buffer of exactly the right length (from the `*_len`
/// functions), as a loaned shared-memory slice is.
struct Writer<'a> {
    buffer: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        self.buffer[self.at..end].copy_from_slice(bytes);
        self.at = end;
    }

    fn padded(&mut self, bytes: &[u8]) {
        self.put(bytes);
        let end = self.at + (pad8(bytes.len()) - bytes.len());
        self.buffer[self.at..end].fill(0);
        self.at = end;
    }

    fn parameters(&mut self, parameters: &[Parameter<'_>]) {
        self.put(&[PARAMETERS_VERSION, 0]);
        self.put(&(parameters.len() as u16).to_le_bytes());
        self.put(&[0; 4]);
        for p in parameters {
            let (kind, value) = p.value.encode();
            self.put(&(p.name.len() as u16).to_le_bytes());
            self.put(&[kind, 0]);
            self.put(&(value.len() as u32).to_le_bytes());
            self.padded(p.name.as_bytes());
            self.padded(&value);
        }
    }

    fn tensor(&mut self, t: &TensorOut<'_>) {
        self.put(&(t.name.len() as u16).to_le_bytes());
        self.put(&[t.datatype, t.dims.len() as u8]);
        self.put(&[0; 4]);
        self.put(&(t.data.len() as u64).to_le_bytes());
        for d in t.dims {
            self.put(&d.to_le_bytes());
        }
        self.padded(t.name.as_bytes());
        self.padded(t.data);
    }

    #[allow(clippy::too_many_arguments)]
    fn header(
        &mut self,
        magic: [u8; 4],
        kind: u8,
        error: u8,
        count: usize,
        request_id: u64,
        words: [u32; 4],
    ) {
        self.put(&magic);
        self.put(&[kind, error]);
        self.put(&(count as u16).to_le_bytes());
        self.put(&request_id.to_le_bytes());
        for word in words {
            self.put(&word.to_le_bytes());
        }
    }
}

/// Bytes of an infer request with `parameters` (at most [`MAX_PARAMETERS`],
/// names and strings of at most [`MAX_PARAMETER_BYTES`]) and `inputs`.
pub fn infer_request_len(parameters: &[Parameter<'_>], inputs: &[TensorOut<'_>]) -> usize {
    let block = if parameters.is_empty() {
        0
    } else {
        parameters
            .iter()
            .fold(8usize, |n, p| n.saturating_add(p.len()))
    };
    tensors_len(inputs).saturating_add(block)
}

/// Bytes of a header and `tensors`.
fn tensors_len(tensors: &[TensorOut<'_>]) -> usize {
    tensors
        .iter()
        .fold(HEADER_BYTES, |n, t| n.saturating_add(t.len()))
}

/// Writes an infer request into `buffer` (exactly [`infer_request_len`]
/// bytes); the parameter block only when there are parameters.
pub fn write_infer_request(
    buffer: &mut [u8],
    request_id: u64,
    handle: u64,
    timeout_us: u32,
    parameters: &[Parameter<'_>],
    inputs: &[TensorOut<'_>],
) {
    let mut w = Writer { buffer, at: 0 };
    let flags = if parameters.is_empty() {
        0
    } else {
        FLAG_PARAMETERS
    };
    w.header(
        REQUEST_MAGIC,
        RequestKind::Infer as u8,
        flags,
        inputs.len(),
        request_id,
        [halves(handle).0, halves(handle).1, timeout_us, 0],
    );
    if !parameters.is_empty() {
        w.parameters(parameters);
    }
    for t in inputs {
        w.tensor(t);
    }
}

/// Bytes of a lookup request.
pub fn lookup_request_len(name: &str, version: &str) -> usize {
    HEADER_BYTES + 8 + pad8(name.len()) + pad8(version.len())
}

/// Writes a lookup request into `buffer` (exactly [`lookup_request_len`] bytes).
pub fn write_lookup_request(buffer: &mut [u8], request_id: u64, name: &str, version: &str) {
    let mut w = Writer { buffer, at: 0 };
    w.header(
        REQUEST_MAGIC,
        RequestKind::Lookup as u8,
        0,
        0,
        request_id,
        [0; 4],
    );
    w.put(&(name.len() as u16).to_le_bytes());
    w.put(&(version.len() as u16).to_le_bytes());
    w.put(&[0; 4]);
    w.padded(name.as_bytes());
    w.padded(version.as_bytes());
}

/// Bytes of an infer answer with `outputs`.
pub fn infer_answer_len(outputs: &[TensorOut<'_>]) -> usize {
    tensors_len(outputs)
}

/// Writes an infer answer into `buffer` (exactly [`infer_answer_len`] bytes).
pub fn write_infer_answer(
    buffer: &mut [u8],
    request_id: u64,
    queue_us: u32,
    compute_us: u32,
    outputs: &[TensorOut<'_>],
) {
    let mut w = Writer { buffer, at: 0 };
    w.header(
        ANSWER_MAGIC,
        2,
        0,
        outputs.len(),
        request_id,
        [0, queue_us, compute_us, 0],
    );
    for t in outputs {
        w.tensor(t);
    }
}

/// Bytes of a lookup answer.
pub fn lookup_answer_len(inputs: &[TensorOut<'_>], outputs: &[TensorOut<'_>]) -> usize {
    tensors_len(inputs).saturating_add(tensors_len(outputs) - HEADER_BYTES)
}

/// Writes a lookup answer into `buffer` (exactly [`lookup_answer_len`] bytes).
pub fn write_lookup_answer(
    buffer: &mut [u8],
    request_id: u64,
    handle: u64,
    inputs: &[TensorOut<'_>],
    outputs: &[TensorOut<'_>],
) {
    let mut w = Writer { buffer, at: 0 };
    let count = inputs.len() + outputs.len();
    w.header(
        ANSWER_MAGIC,
        1,
        0,
        count,
        request_id,
        [halves(handle).0, halves(handle).1, 0, inputs.len() as u32],
    );
    for t in inputs.iter().chain(outputs) {
        w.tensor(t);
    }
}

/// A 64-bit value's low and high 32-bit halves, as the header stores it.
const fn halves(v: u64) -> (u32, u32) {
    (v as u32, (v >> 32) as u32)
}

/// Bytes of an error answer.
pub fn error_answer_len(message: &str) -> usize {
    HEADER_BYTES + 8 + pad8(message.len())
}

/// Writes an error answer into `buffer` (exactly [`error_answer_len`] bytes).
pub fn write_error_answer(buffer: &mut [u8], request_id: u64, code: ErrorCode, message: &str) {
    let mut w = Writer { buffer, at: 0 };
    w.header(ANSWER_MAGIC, 3, code as u8, 0, request_id, [0; 4]);
    w.put(&(message.len() as u32).to_le_bytes());
    w.put(&[0; 4]);
    w.padded(message.as_bytes());
}

#[cfg(test)]
mod tests;
