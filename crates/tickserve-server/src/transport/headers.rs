//! The headers an HTTP inference request's path reads (its body's length,
//! its deadline, its `traceparent`, a front end's own), found in one pass
//! over the request's header map. A lookup per name hashes the name (byte
//! by byte for one outside the standard set) and probes the map; the few
//! headers a request carries are fewer steps to walk once.

use axum::http::{HeaderMap, HeaderName, HeaderValue, header};

use super::{deadline, trace};

/// The headers an inference request's path reads, each the first value of
/// its name (as `HeaderMap::get` finds it).
#[derive(Default)]
pub struct InferHeaders<'a> {
    /// `Content-Length`.
    pub content_length: Option<&'a HeaderValue>,
    /// [`deadline::TIMEOUT`].
    pub timeout: Option<&'a HeaderValue>,
    /// [`trace::NAME`].
    pub traceparent: Option<&'a HeaderValue>,
    /// The front end's own header, where it names one.
    pub own: Option<&'a HeaderValue>,
    /// [`super::sequence_key::NAME`]: every value (a repeated one is refused).
    pub sequence_key: Vec<&'a HeaderValue>,
}

impl<'a> InferHeaders<'a> {
    /// Finds them in `headers`; `own` is the front end's own header's name.
    pub fn of(headers: &'a HeaderMap, own: Option<&HeaderName>) -> InferHeaders<'a> {
        let mut found = InferHeaders::default();
        for (name, value) in headers {
            let slot = if name == header::CONTENT_LENGTH {
                &mut found.content_length
            } else if *name == deadline::TIMEOUT {
                &mut found.timeout
            } else if *name == trace::NAME {
                &mut found.traceparent
            } else if own.is_some_and(|own| own == name) {
                &mut found.own
            } else if *name == super::sequence_key::NAME {
                found.sequence_key.push(value);
                continue;
            } else {
                continue;
            };
            slot.get_or_insert(value);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each header is found as a lookup by its name finds it: the first of
    /// repeated values, whatever else the request carries.
    #[test]
    fn one_pass_finds_what_lookups_find() {
        let own = HeaderName::from_static("inference-header-content-length");
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("localhost"));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("224"));
        headers.append(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        headers.insert(own.clone(), HeaderValue::from_static("160"));
        headers.insert("x-other", HeaderValue::from_static("1"));
        headers.insert(deadline::TIMEOUT.clone(), HeaderValue::from_static("2ms"));
        headers.append(deadline::TIMEOUT.clone(), HeaderValue::from_static("9ms"));
        let found = InferHeaders::of(&headers, Some(&own));
        assert_eq!(found.content_length, headers.get(header::CONTENT_LENGTH));
        assert_eq!(found.timeout, headers.get(&deadline::TIMEOUT));
        assert_eq!(found.own, headers.get(&own));
        assert_eq!(found.traceparent, None);
        assert_eq!(InferHeaders::of(&headers, None).own, None);
        let value = |v: &str| HeaderValue::from_str(v).unwrap();
        let mut traced = HeaderMap::new();
        traced.insert(
            trace::NAME.clone(),
            value("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        assert_eq!(
            InferHeaders::of(&traced, None).traceparent,
            traced.get(&trace::NAME)
        );
    }
}
