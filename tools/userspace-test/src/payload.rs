// SPDX-License-Identifier: GPL-2.0
//! Bytes: private data and messages as people type them and as the suite
//! generates and checks them, and how they are shown.

use anyhow::{anyhow, bail, Context, Result};
use std::fmt::Write as _;

/// Lower-case hex, `-` for nothing (so that it stays one word).
pub fn hex(data: &[u8]) -> String {
    let mut s = String::with_capacity(data.len() * 2);
    for b in data {
        let _ = write!(s, "{b:02x}");
    }
    if s.is_empty() {
        s.push('-');
    }
    s
}

/// The inverse of [`hex`].
pub fn unhex(s: &str) -> Result<Vec<u8>> {
    if s == "-" {
        return Ok(Vec::new());
    }
    if !s.len().is_multiple_of(2) {
        bail!("odd hex length");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| anyhow!("bad hex at {i}"))
        })
        .collect()
}

/// `len` bytes that differ from one offset to the next and from one seed to
/// another, so that a shifted, truncated or foreign buffer never matches.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

/// rping's 16-byte buffer advertisement: big-endian address, rkey, length.
pub fn advert(addr: u64, rkey: u32, len: u32) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[..8].copy_from_slice(&addr.to_be_bytes());
    a[8..12].copy_from_slice(&rkey.to_be_bytes());
    a[12..].copy_from_slice(&len.to_be_bytes());
    a
}

/// Parses [`advert`]'s format: (address, rkey, length).
pub fn parse_advert(a: &[u8]) -> Result<(u64, u32, u32)> {
    if a.len() != 16 {
        bail!("an advertisement is 16 bytes, not {}", a.len());
    }
    Ok((
        u64::from_be_bytes(a[..8].try_into()?),
        u32::from_be_bytes(a[8..12].try_into()?),
        u32::from_be_bytes(a[12..].try_into()?),
    ))
}

/// FNV-1a, to report a large buffer's contents on one line.
pub fn fnv64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `len` bytes of printable text (`0123456789abcdefghijklmnopqrstuvwxyz`
/// over and over), for limits tried by hand.
pub fn text_of_len(len: usize) -> Vec<u8> {
    const CYCLE: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    CYCLE.iter().copied().cycle().take(len).collect()
}

/// Data as typed on a command line: `hex:0a0b...`, `len:N` (N bytes of
/// [`text_of_len`]), or the text itself.
pub fn parse_data(s: &str) -> Result<Vec<u8>> {
    if let Some(h) = s.strip_prefix("hex:") {
        unhex(h)
    } else if let Some(n) = s.strip_prefix("len:") {
        Ok(text_of_len(n.parse().context("len:N")?))
    } else {
        Ok(s.as_bytes().to_vec())
    }
}

/// Bytes given on the command line (see [`parse_data`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// [`parse_data`] for clap.
pub fn parse_bytes(s: &str) -> Result<Bytes> {
    parse_data(s).map(Bytes)
}

/// Checks that `got` is `want`, or says where they part.
pub fn verify(what: &str, want: &[u8], got: &[u8]) -> Result<()> {
    if want == got {
        return Ok(());
    }
    let at = want.iter().zip(got).position(|(a, b)| a != b);
    match at {
        Some(i) => bail!(
            "{what}: {} bytes, expected {}; first difference at byte {i}: {:#04x} instead of {:#04x}",
            got.len(),
            want.len(),
            got[i],
            want[i]
        ),
        None => bail!(
            "{what}: {} bytes, expected {} (same prefix)",
            got.len(),
            want.len()
        ),
    }
}

/// Checks bytes the CM padded: `want` then zeros, `padded_to` in all.
pub fn verify_padded(what: &str, want: &[u8], got: &[u8], padded_to: usize) -> Result<()> {
    let mut full = want.to_vec();
    if full.len() < padded_to {
        full.resize(padded_to, 0);
    }
    verify(what, &full, got)
}

/// Bytes of text (or hex digits' worth) shown before `...`.
const SHOW_MAX: usize = 200;

/// How bytes are shown to people: `NAME(LEN)="text"` when the bytes are
/// printable text (CM padding — trailing zeros — summarised as `+N*\0`),
/// else `NAME(LEN)=hex:...`; LEN is the length reported, and long contents
/// end in `...`.
pub fn show(name: &str, data: &[u8]) -> String {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let (text, pad) = data.split_at(end);
    let printable = text.iter().all(|&b| b.is_ascii_graphic() || b == b' ');
    let mut out = format!("{name}({})=", data.len());
    if printable {
        out.push('"');
        for &b in text.iter().take(SHOW_MAX) {
            if b == b'"' || b == b'\\' {
                out.push('\\');
            }
            out.push(b as char);
        }
        if text.len() > SHOW_MAX {
            out.push_str("...");
        }
        out.push('"');
        if !pad.is_empty() {
            let _ = write!(out, "+{}*\\0", pad.len());
        }
    } else {
        let _ = write!(out, "hex:{}", hex(&data[..data.len().min(SHOW_MAX / 2)]));
        if data.len() > SHOW_MAX / 2 {
            out.push_str("...");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        for data in [&b""[..], b"a", b"\x00\xff\x10"] {
            assert_eq!(unhex(&hex(data)).unwrap(), data);
        }
        assert_eq!(hex(b""), "-");
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
        assert!(unhex("\u{e9}a").is_err());
    }

    #[test]
    fn patterns_are_distinct() {
        assert_eq!(pattern(56, 1).len(), 56);
        assert_ne!(pattern(8, 1), pattern(8, 2));
        // No period of 256: a message shifted by 256 bytes does not match.
        let p = pattern(4096, 0);
        assert_ne!(p[..256], p[256..512]);
        assert_eq!(pattern(4096, 7), pattern(4096, 7));
    }

    #[test]
    fn parses_typed_data() {
        assert_eq!(parse_data("hello").unwrap(), b"hello");
        assert_eq!(parse_data("hex:00ff").unwrap(), [0, 255]);
        assert_eq!(parse_data("len:57").unwrap().len(), 57);
        assert_eq!(
            parse_data("len:38").unwrap(),
            b"0123456789abcdefghijklmnopqrstuvwxyz01"
        );
        assert_eq!(parse_data("").unwrap(), b"");
        assert!(parse_data("len:x").is_err());
        assert!(parse_data("hex:0").is_err());
    }

    #[test]
    fn verify_says_where() {
        assert!(verify("m", b"abc", b"abc").is_ok());
        let e = verify("m", b"abc", b"abd").unwrap_err().to_string();
        assert!(e.contains("byte 2"), "{e}");
        let e = verify("m", b"abc", b"ab").unwrap_err().to_string();
        assert!(e.contains("2 bytes, expected 3"), "{e}");
        assert!(verify_padded("p", b"hi", b"hi\0\0", 4).is_ok());
        assert!(verify_padded("p", b"hi", b"hi\0", 4).is_err());
        assert!(verify_padded("p", &[1; 56], &[1; 56], 56).is_ok());
    }

    #[test]
    fn shows_text_and_binary() {
        assert_eq!(show("private_data", b""), "private_data(0)=\"\"");
        assert_eq!(
            show("private_data", b"hi\0\0"),
            "private_data(4)=\"hi\"+2*\\0"
        );
        assert_eq!(show("m", b"a\"b"), "m(3)=\"a\\\"b\"");
        assert_eq!(show("m", &[1, 0, 2]), "m(3)=hex:010002");
        let long = show("m", &[b'e'; 4000]);
        assert!(long.starts_with("m(4000)=\"eee") && long.ends_with("e...\""));
        assert!(long.len() < 300);
        let bin = show("m", &[1; 4096]);
        assert!(bin.starts_with("m(4096)=hex:0101") && bin.ends_with("01..."));
    }
}
