//! A client's text in the server's messages: quoted short, never whole. A
//! hostile client sends a 2 MiB string where a number belongs; the error
//! names it by a short prefix and its length, and no error message is longer
//! than [`MAX_MESSAGE_BYTES`] on any front end (gRPC carries it in a header).

/// The most bytes of a client's string an error quotes.
pub const MAX_QUOTED_BYTES: usize = 64;

/// The longest error message an answer carries.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `text` quoted (Rust's escapes, as `{:?}` writes it), cut after
/// [`MAX_QUOTED_BYTES`] with its length: `"abc…" (2097152 bytes)`.
pub fn quote(text: &str) -> String {
    if text.len() <= MAX_QUOTED_BYTES {
        return format!("{text:?}");
    }
    let prefix = &text[..floor_char_boundary(text, MAX_QUOTED_BYTES)];
    let quoted = format!("{prefix:?}");
    let open = quoted.strip_suffix('"').unwrap_or(&quoted);
    format!("{open}…\" ({} bytes)", text.len())
}

/// `message` with every quoted string in it (`"…"`, with `\` escapes, as
/// serde and `{:?}` write them) longer than [`MAX_QUOTED_BYTES`] cut as
/// [`quote`] cuts it, then the whole cut at [`MAX_MESSAGE_BYTES`].
pub fn clip_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_BYTES + 64));
    let mut rest = message;
    while let Some(open) = rest.find('"') {
        out.push_str(&rest[..=open]);
        let body = &rest[open + 1..];
        let Some(close) = closing_quote(body) else {
            // No closing quote: the rest is text as it is.
            rest = body;
            break;
        };
        let inner = &body[..close];
        if inner.len() <= MAX_QUOTED_BYTES {
            out.push_str(inner);
        } else {
            let cut = floor_char_boundary(inner, MAX_QUOTED_BYTES);
            // Never end inside an escape: back up to before a trailing `\`s run.
            let kept = inner[..cut].trim_end_matches('\\');
            out.push_str(kept);
            out.push_str(&format!("…\" ({} bytes quoted)", inner.len()));
            rest = &body[close + 1..];
            continue;
        }
        out.push('"');
        rest = &body[close + 1..];
    }
    out.push_str(rest);
    clip(&out, MAX_MESSAGE_BYTES)
}

/// `text` cut at `max` bytes (at a character boundary), saying how long it was.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let cut = floor_char_boundary(text, max);
    format!(
        "{}… (message cut at {cut} of {} bytes)",
        &text[..cut],
        text.len()
    )
}

/// The byte index of the quote that closes a string starting at `body`'s
/// first byte (skipping `\`-escaped characters), if there is one.
fn closing_quote(body: &str) -> Option<usize> {
    let bytes = body.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// The largest character boundary of `text` at or below `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut i = index.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_string_is_quoted_whole_and_a_long_one_by_its_prefix_and_length() {
        assert_eq!(quote("abc"), "\"abc\"");
        let long = "é".repeat(1 << 20);
        let quoted = quote(&long);
        assert!(quoted.len() < 120, "{quoted}");
        assert!(quoted.ends_with("…\" (2097152 bytes)"), "{quoted}");
        assert!(quoted.starts_with("\"éé"), "{quoted}");
    }

    #[test]
    fn quoted_strings_in_a_message_are_cut_and_the_message_bounded() {
        let long = "x".repeat(2 << 20);
        let serde = format!("invalid type: string {long:?}, expected f32");
        let clipped = clip_message(&serde);
        assert!(clipped.len() < 200, "{clipped}");
        assert!(
            clipped.starts_with("invalid type: string \"xxx"),
            "{clipped}"
        );
        assert!(
            clipped.ends_with(" (2097152 bytes quoted), expected f32"),
            "{clipped}"
        );
        // Escapes inside are skipped over, short strings kept whole.
        let message = r#"got "a\"b" and "c""#;
        assert_eq!(clip_message(message), message);
        let escaped = format!("{:?} then \"ok\"", "\"".repeat(100));
        let clipped = clip_message(&escaped);
        assert!(clipped.ends_with("quoted) then \"ok\""), "{clipped}");
        assert!(!clipped.contains("\\…"), "{clipped}");
        // An unclosed quote, and a message long without quotes.
        assert_eq!(clip_message("a \"b"), "a \"b");
        let plain = "y".repeat(10_000);
        let clipped = clip_message(&plain);
        assert!(clipped.len() <= MAX_MESSAGE_BYTES + 64, "{}", clipped.len());
        assert!(clipped.ends_with("(message cut at 4096 of 10000 bytes)"));
    }
}
