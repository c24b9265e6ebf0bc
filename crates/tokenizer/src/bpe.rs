//! The two merge algorithms: byte-level BPE by merge rank (llama.cpp's
//! `llm_tokenizer_bpe_session`) and SentencePiece BPE by token score
//! (`llm_tokenizer_spm_session`). Both keep a doubly linked list of symbols and a priority
//! queue of candidate pairs; a popped pair is stale when either side has since changed
//! length, which is exactly llama.cpp's "text no longer matches" test.

use crate::fxhash::FxHashMap;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// "No piece": a symbol whose text is neither a token nor part of any merge.
pub(crate) const NO_PIECE: u32 = u32::MAX;

/// Byte-level BPE tables. Strings are interned to "piece ids": ids below `n_vocab` are
/// token ids (the first token with that text); higher ids are merge-only strings.
pub(crate) struct BpeMerges {
    /// `(left piece, right piece)` → `(rank, merged piece)`.
    pub merges: FxHashMap<(u32, u32), (u32, u32)>,
    /// Piece of the one-char string that byte `b` maps to.
    pub byte_piece: [u32; 256],
    /// Token of the one-char string `b` for printable ASCII bytes: when a merge makes a
    /// string that is not a token, llama.cpp looks up each byte of the encoded text on
    /// its own, and only those bytes encode as themselves. The other bytes of such a
    /// piece are dropped, as llama.cpp drops them (StarCoder's vocabulary has merges
    /// like that: `decode(encode("\u{79e79}"))` loses the first byte).
    pub ascii_token: [Option<u32>; 128],
}

/// A mergeable pair: (rank, left, right, size, merged piece). Popped from a min-heap, so
/// the lowest rank wins and, among equal ranks, the leftmost pair.
type Candidate = (u32, u32, u32, u32, u32);

struct Sym {
    prev: i32,
    next: i32,
    piece: u32,
    start: u32,
    len: u32,
}

impl BpeMerges {
    /// Merge one pre-tokenized word (raw bytes; byte-level mapping is implicit in
    /// `byte_piece`) and append its tokens.
    pub(crate) fn encode_word(&self, word: &[u8], n_vocab: u32, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        let n = word.len();
        let mut syms: Vec<Sym> = word
            .iter()
            .enumerate()
            .map(|(i, &b)| Sym {
                prev: i as i32 - 1,
                next: if i + 1 == n { -1 } else { i as i32 + 1 },
                piece: self.byte_piece[b as usize],
                start: i as u32,
                len: 1,
            })
            .collect();
        let mut heap: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let add = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: i32, r: i32| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            if ls.piece == NO_PIECE || rs.piece == NO_PIECE {
                return;
            }
            if let Some(&(rank, merged)) = self.merges.get(&(ls.piece, rs.piece)) {
                heap.push(Reverse((rank, l as u32, r as u32, ls.len + rs.len, merged)));
            }
        };
        for i in 1..n as i32 {
            add(&mut heap, &syms, i - 1, i);
        }
        while let Some(Reverse((_, l, r, size, merged))) = heap.pop() {
            let (l, r) = (l as usize, r as usize);
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != size {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[l].piece = merged;
            syms[r].len = 0;
            let next = syms[r].next;
            syms[l].next = next;
            if next >= 0 {
                syms[next as usize].prev = l as i32;
            }
            let prev = syms[l].prev;
            add(&mut heap, &syms, prev, l as i32);
            add(&mut heap, &syms, l as i32, next);
        }
        let mut i = 0i32;
        while i >= 0 {
            let s = &syms[i as usize];
            if s.piece < n_vocab {
                out.push(s.piece);
            } else {
                for &b in &word[s.start as usize..(s.start + s.len) as usize] {
                    if let Some(Some(id)) = self.ascii_token.get(b as usize) {
                        out.push(*id);
                    }
                }
            }
            i = s.next;
        }
    }
}

struct SpmBigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for SpmBigram {
    /// Highest score first; on a tie, the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then_with(|| other.left.cmp(&self.left))
    }
}

struct SpmSym {
    prev: i32,
    next: i32,
    start: u32,
    len: u32,
}

/// SentencePiece BPE over `text` (spaces already escaped to `▁`): merge the adjacent pair
/// whose concatenation is the highest-scoring vocab entry until none is left; symbols that
/// are not tokens fall back to `<0xNN>` byte tokens (or `unk` when the vocab has none).
pub(crate) fn spm_encode(
    text: &str,
    vocab: &FxHashMap<Box<str>, u32>,
    scores: &[f32],
    byte_tokens: &[Option<u32>; 256],
    unk: Option<u32>,
    out: &mut Vec<u32>,
) {
    if text.is_empty() {
        return;
    }
    let mut syms: Vec<SpmSym> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        syms.push(SpmSym { prev: i as i32 - 1, next: i as i32 + 1, start: start as u32, len: c.len_utf8() as u32 });
    }
    if let Some(last) = syms.last_mut() {
        last.next = -1;
    }
    let lookup = |syms: &[SpmSym], l: usize, r: usize| -> Option<(u32, u32)> {
        let start = syms[l].start as usize;
        let size = (syms[l].len + syms[r].len) as usize;
        vocab.get(&text[start..start + size]).map(|&id| (id, size as u32))
    };
    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<SpmBigram>, syms: &[SpmSym], l: i32, r: i32| {
        if l < 0 || r < 0 {
            return;
        }
        if let Some((id, size)) = lookup(syms, l as usize, r as usize) {
            let score = scores.get(id as usize).copied().unwrap_or(0.0);
            heap.push(SpmBigram { score, left: l as u32, right: r as u32, size });
        }
    };
    for i in 1..syms.len() as i32 {
        try_add(&mut heap, &syms, i - 1, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left as usize, b.right as usize);
        if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != b.size {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        let next = syms[r].next;
        syms[l].next = next;
        if next >= 0 {
            syms[next as usize].prev = l as i32;
        }
        let prev = syms[l].prev;
        try_add(&mut heap, &syms, prev, l as i32);
        try_add(&mut heap, &syms, l as i32, next);
    }
    let mut i = 0i32;
    while i >= 0 {
        let s = &syms[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match vocab.get(piece) {
            Some(&id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    if let Some(id) = byte_tokens[b as usize].or(unk) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}
