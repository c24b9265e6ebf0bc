//! Code point categories and the GPT-2 byte-to-unicode table.
//!
//! llama.cpp classifies every code point once (generated from Python's `regex` module:
//! `\p{N}`, `\p{L}`, `\p{Z}`, `\p{M}`, `\p{P}`, `\p{S}`, `\p{C}` and `\s`) and its
//! pre-tokenizers work on those flags. We derive the same table from `regex-syntax`'s
//! Unicode classes, so no generated data lives in this crate. Every assigned or
//! unassigned code point falls in exactly one general category (`\p{C}` includes
//! unassigned), so a flag word is never zero for a real code point; zero means "outside
//! the fragment", which the splitters rely on.

use std::sync::OnceLock;

/// `\p{N}`.
pub(crate) const NUMBER: u16 = 1 << 1;
/// `\p{L}`.
pub(crate) const LETTER: u16 = 1 << 2;
/// `\p{Z}`.
pub(crate) const SEPARATOR: u16 = 1 << 3;
/// `\p{M}`.
pub(crate) const MARK: u16 = 1 << 4;
/// `\p{P}`.
pub(crate) const PUNCTUATION: u16 = 1 << 5;
/// `\p{S}`.
pub(crate) const SYMBOL: u16 = 1 << 6;
/// `\p{C}`.
pub(crate) const CONTROL: u16 = 1 << 7;
/// No category matched (never expected; keeps the flag word non-zero).
pub(crate) const UNDEFINED: u16 = 1 << 0;
/// `\s` (Unicode `White_Space`).
pub(crate) const WHITESPACE: u16 = 1 << 8;
/// The general-category bits.
pub(crate) const CATEGORIES: u16 = 0xFF;

struct FlagTable {
    /// Flags of every code point below 0x10000.
    bmp: Box<[u16]>,
    /// `(first, flags)` runs for the supplementary planes, sorted; a run lasts until the next.
    upper: Vec<(u32, u16)>,
}

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    // The patterns are fixed and valid; a parse failure would be a bug in this file.
    let hir = regex_syntax::parse(pattern).expect("built-in Unicode class pattern");
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c.ranges().iter().map(|r| (r.start() as u32, r.end() as u32)).collect(),
        _ => Vec::new(),
    }
}

fn build_table() -> FlagTable {
    const MAX: usize = 0x110000;
    let mut all = vec![0u16; MAX];
    for (pattern, bit) in [
        (r"\p{N}", NUMBER),
        (r"\p{L}", LETTER),
        (r"\p{Z}", SEPARATOR),
        (r"\p{M}", MARK),
        (r"\p{P}", PUNCTUATION),
        (r"\p{S}", SYMBOL),
        (r"\p{C}", CONTROL),
        (r"\s", WHITESPACE),
    ] {
        for (lo, hi) in class_ranges(pattern) {
            for f in &mut all[lo as usize..=hi as usize] {
                *f |= bit;
            }
        }
    }
    for f in all.iter_mut() {
        if *f & CATEGORIES == 0 {
            *f |= UNDEFINED;
        }
    }
    // Surrogates cannot occur in a `str`; `\p{C}` (Cs) covers them in Python's table.
    for f in &mut all[0xD800..0xE000] {
        *f = CONTROL;
    }
    let bmp = all[..0x10000].to_vec().into_boxed_slice();
    let mut upper: Vec<(u32, u16)> = Vec::new();
    for (cp, &f) in all.iter().enumerate().skip(0x10000) {
        if upper.last().map(|&(_, g)| g != f).unwrap_or(true) {
            upper.push((cp as u32, f));
        }
    }
    FlagTable { bmp, upper }
}

fn table() -> &'static FlagTable {
    static TABLE: OnceLock<FlagTable> = OnceLock::new();
    TABLE.get_or_init(build_table)
}

/// The flags of one code point (never zero).
#[inline]
pub(crate) fn flags(c: char) -> u16 {
    let cp = c as u32;
    let t = table();
    if cp < 0x10000 {
        t.bmp[cp as usize]
    } else {
        let i = t.upper.partition_point(|&(start, _)| start <= cp);
        t.upper[i - 1].1
    }
}

/// The flags of every char of `text`.
pub(crate) fn flags_of(chars: &[char]) -> Vec<u16> {
    let t = table();
    chars
        .iter()
        .map(|&c| {
            let cp = c as u32;
            if cp < 0x10000 {
                t.bmp[cp as usize]
            } else {
                flags(c)
            }
        })
        .collect()
}

/// GPT-2's reversible byte → printable-char table (`bytes_to_unicode`): printable Latin-1
/// bytes map to themselves, the other 68 to U+0100.. in byte order.
pub(crate) fn byte_to_char() -> &'static [char; 256] {
    static MAP: OnceLock<[char; 256]> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut map = ['\0'; 256];
        let mut n = 0u32;
        for b in 0..256u32 {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            map[b as usize] = char::from_u32(cp).expect("below 0x144");
        }
        map
    })
}

/// Inverse of [`byte_to_char`].
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    static INV: OnceLock<Vec<i16>> = OnceLock::new();
    let inv = INV.get_or_init(|| {
        let mut inv = vec![-1i16; 0x144];
        for (b, &c) in byte_to_char().iter().enumerate() {
            inv[c as usize] = b as i16;
        }
        inv
    });
    inv.get(c as usize).and_then(|&b| u8::try_from(b).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        assert_eq!(flags('a') & LETTER, LETTER);
        assert_eq!(flags('7') & NUMBER, NUMBER);
        assert_eq!(flags('½') & NUMBER, NUMBER);
        assert_eq!(flags(' ') & WHITESPACE, WHITESPACE);
        assert_eq!(flags('\u{3000}') & WHITESPACE, WHITESPACE);
        assert_eq!(flags('\u{1C}') & WHITESPACE, 0);
        assert_eq!(flags('!') & PUNCTUATION, PUNCTUATION);
        assert_eq!(flags('~') & SYMBOL, SYMBOL);
        assert_eq!(flags('\u{301}') & MARK, MARK);
        assert_eq!(flags('😀') & SYMBOL, SYMBOL);
        assert_eq!(flags('𝔸') & LETTER, LETTER);
        assert_eq!(flags('\u{10FFFF}') & CONTROL, CONTROL);
        assert_eq!(flags('\u{E0080}') & CATEGORIES, CONTROL); // unassigned → Cn
    }

    #[test]
    fn byte_table_round_trips() {
        let map = byte_to_char();
        assert_eq!(map[b' ' as usize], 'Ġ');
        assert_eq!(map[b'\n' as usize], 'Ċ');
        assert_eq!(map[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(map[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('€'), None);
    }
}
