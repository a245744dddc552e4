//! The gRPC codec: prost's, behind a walk over each incoming message's
//! top-level fields that refuses a message whose repeated field holds more
//! than [`MAX_ENTRIES`] entries, before prost builds anything.
//!
//! prost decodes a message whole, and an entry costs far more in memory than
//! on the wire: an empty `inputs` entry of a `ModelInferRequest` is 2 bytes on
//! the wire and a few hundred in memory (a 14 MiB message of them once raised
//! the server's peak memory by 1.9 GiB). The walk reads only field keys and
//! lengths, allocates nothing, and leaves a malformed message to prost's own
//! error. Both the generated server and client use this codec
//! (`build.rs`: `codec_path`).

use std::marker::PhantomData;

use bytes::Buf;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The most entries one repeated (or map) field of a message may hold: far
/// above any real request (a model has a handful of inputs), far below what
/// would cost memory.
pub const MAX_ENTRIES: usize = 4096;

/// prost's codec, with incoming messages checked by [`check_entries`].
#[derive(Debug)]
pub struct BoundedCodec<T, U> {
    inner: ProstCodec<T, U>,
}

impl<T, U> Default for BoundedCodec<T, U> {
    fn default() -> Self {
        BoundedCodec {
            inner: ProstCodec::default(),
        }
    }
}

impl<T, U> Codec for BoundedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BoundedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.inner.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder {
            inner: self.inner.decoder(),
            _message: PhantomData,
        }
    }
}

/// prost's decoder behind [`check_entries`].
#[derive(Debug)]
pub struct BoundedDecoder<U> {
    inner: ProstDecoder<U>,
    _message: PhantomData<U>,
}

impl<U: prost::Message + Default> Decoder for BoundedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The frame is one contiguous buffer (tonic's DecodeBuf over BytesMut).
        if src.chunk().len() == src.remaining() {
            check_entries(src.chunk()).map_err(Status::invalid_argument)?;
        }
        self.inner.decode(src)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// Counts the entries of each top-level field of the protobuf message in
/// `bytes`; more than [`MAX_ENTRIES`] of one field is an error naming it.
/// A malformed message passes (prost refuses it with its own message).
pub fn check_entries(bytes: &[u8]) -> Result<(), String> {
    // Field numbers of the messages served are small; others share a slot.
    let mut counts = [0usize; 32];
    let mut at = 0;
    while at < bytes.len() {
        let Some((key, next)) = varint(bytes, at) else {
            return Ok(());
        };
        at = next;
        let field = key >> 3;
        let skip = match key & 7 {
            0 => match varint(bytes, at) {
                Some((_, next)) => next - at,
                None => return Ok(()),
            },
            1 => 8,
            2 => match varint(bytes, at) {
                Some((len, next)) => {
                    let Ok(len) = usize::try_from(len) else {
                        return Ok(());
                    };
                    (next - at).saturating_add(len)
                }
                None => return Ok(()),
            },
            5 => 4,
            _ => return Ok(()),
        };
        at = at.saturating_add(skip);
        let slot = usize::try_from(field).map_or(0, |f| f.min(counts.len() - 1));
        counts[slot] += 1;
        if counts[slot] > MAX_ENTRIES {
            return Err(format!(
                "field {field} of the message repeats more than {MAX_ENTRIES} times \
                 (tickserve's limit per repeated field)"
            ));
        }
    }
    Ok(())
}

/// The varint at `at` and the position after it.
fn varint(bytes: &[u8], mut at: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(at)?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((value, at));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_empty_entries_are_refused_before_decoding() {
        // Field 5, length 0: one empty `inputs` entry, 2 bytes.
        let many: Vec<u8> = std::iter::repeat_n([0x2a, 0x00], MAX_ENTRIES + 1)
            .flatten()
            .collect();
        let error = check_entries(&many).unwrap_err();
        assert!(error.contains("field 5"), "{error}");
        let enough: Vec<u8> = std::iter::repeat_n([0x2a, 0x00], MAX_ENTRIES)
            .flatten()
            .collect();
        assert_eq!(check_entries(&enough), Ok(()));
    }

    #[test]
    fn a_real_request_passes_and_malformed_bytes_are_left_to_prost() {
        use prost::Message;
        let request = super::super::pb::ModelInferRequest {
            model_name: "alpha_mlp".into(),
            inputs: vec![Default::default(); 3],
            raw_input_contents: vec![vec![0u8; 200].into(); 3],
            ..Default::default()
        };
        assert_eq!(check_entries(&request.encode_to_vec()), Ok(()));
        assert_eq!(check_entries(&[0xff, 0xff]), Ok(()));
    }
}
