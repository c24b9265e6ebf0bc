//! A buffered writer whose writes end on 2 MiB file offsets, so that a model file is in the
//! page cache as 2 MiB folios from the moment it is written, and its mapping can use 2 MiB
//! pages.
//!
//! Why: decode reads every weight once per token, and a mapping in 4 KiB pages costs it
//! page walks: on the Intel Xeon host of docs/BENCHMARKS.md, session 41, the 7B Q4_0
//! decoded 13% faster (1 and 2 threads) in 2 MiB pages than straight after `hearth synth`
//! had written it through a 1 MiB `BufWriter` (0.37 of 3.7 GB then mapped in 2 MiB pages).
//! A filesystem with large folios (ext4, XFS on Linux 6.x) sizes a written folio by the
//! write, when memory allows: a write that covers an aligned 2 MiB range whole can make one
//! 2 MiB folio. `BufWriter` cannot promise that: it flushes when the next write would
//! overflow its buffer and passes large writes straight through, so its writes start and
//! end wherever the caller's did. (Session 42 did not see session 41's 10% again: synth's
//! output mapped 80-88% in 2 MiB pages through the `BufWriter`, 81-99% through this.)

use std::io::{self, Write};

/// Bytes of one piece: the x86-64 and arm64 (4 KiB granule) PMD page size.
pub const PIECE_BYTES: usize = 2 << 20;

/// Buffers writes to `inner` and hands them on so that each ends on a multiple of
/// [`PIECE_BYTES`] counted from the writer's start (the file's offset 0), except the last
/// one ([`flush`](Write::flush) or [`into_inner`](Self::into_inner)). A flush in the
/// middle writes what is buffered; the writes after it end on the next boundaries again.
pub struct PieceWriter<W: Write> {
    inner: W,
    buf: Vec<u8>,
    /// Bytes handed to `inner` so far.
    written: u64,
}

impl<W: Write> PieceWriter<W> {
    /// Wrap `inner`, which must be at its offset 0 (a new file).
    pub fn new(inner: W) -> Self {
        Self { inner, buf: Vec::new(), written: 0 }
    }

    /// Write what is buffered, flush, and return the destination.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.flush()?;
        Ok(self.inner)
    }

    /// Bytes from here to the next piece boundary (1..=PIECE_BYTES).
    fn room(&self) -> usize {
        PIECE_BYTES - ((self.written + self.buf.len() as u64) % PIECE_BYTES as u64) as usize
    }

    fn write_buffered(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.inner.write_all(&self.buf)?;
            self.written += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }
}

impl<W: Write> Write for PieceWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.room();
        if self.buf.is_empty() && data.len() >= room {
            // Up to the boundary and whole pieces after it, without a copy.
            let n = room + (data.len() - room) / PIECE_BYTES * PIECE_BYTES;
            self.inner.write_all(&data[..n])?;
            self.written += n as u64;
            return Ok(n);
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(PIECE_BYTES);
        }
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if n == room {
            self.write_buffered()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_buffered()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Records where each write to it starts and ends.
    #[derive(Default)]
    struct Log {
        bytes: Vec<u8>,
        writes: Vec<(usize, usize)>,
    }
    impl Write for Log {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.writes.push((self.bytes.len(), self.bytes.len() + b.len()));
            self.bytes.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The writes a GGUF writer makes: many small header fields, then tensors of any size.
    fn sizes() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(prop_oneof![1usize..64, 1usize..5 << 20], 1..40)
    }

    /// Feed `sizes` writes of a counting pattern through `w`, a flush after write `flush_at`.
    fn feed(w: &mut impl Write, sizes: &[usize], flush_at: usize) -> Vec<u8> {
        let mut all = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let chunk: Vec<u8> = (all.len()..all.len() + n).map(|k| (k * 7 % 251) as u8).collect();
            w.write_all(&chunk).unwrap();
            all.extend_from_slice(&chunk);
            if i == flush_at {
                w.flush().unwrap();
            }
        }
        all
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The bytes arrive whole and in order; every write but the last ends on a piece
        /// boundary, except the one a mid-stream flush forces, and after it the writes end
        /// on boundaries again.
        #[test]
        fn writes_end_on_piece_boundaries(sizes in sizes(), flush_at in 0usize..60) {
            let mut w = PieceWriter::new(Log::default());
            let all = feed(&mut w, &sizes, flush_at);
            let log = w.into_inner().unwrap();
            prop_assert_eq!(&log.bytes, &all);
            let forced = flush_at < sizes.len() - 1;
            let ragged: Vec<_> = log.writes[..log.writes.len().saturating_sub(1)]
                .iter()
                .filter(|&&(_, end)| end % PIECE_BYTES != 0)
                .collect();
            prop_assert!(ragged.len() <= forced as usize, "{:?}", log.writes);
        }
    }

    /// The control: `std::io::BufWriter` (what the GGUF writer used before) ends its
    /// writes wherever the caller's writes fall, so the property above is not trivial.
    #[test]
    fn bufwriter_writes_end_anywhere() {
        let sizes = [100, 3 << 20, 17, 1 << 20, 5 << 20, 9];
        let mut w = io::BufWriter::with_capacity(1 << 20, Log::default());
        feed(&mut w, &sizes, usize::MAX);
        let log = w.into_inner().map_err(|e| e.into_error()).unwrap();
        let ragged = log.writes[..log.writes.len() - 1].iter().filter(|&&(_, end)| end % PIECE_BYTES != 0).count();
        assert!(ragged >= 3, "{:?}", log.writes);
        let mut w = PieceWriter::new(Log::default());
        feed(&mut w, &sizes, usize::MAX);
        let log = w.into_inner().unwrap();
        assert!(log.writes[..log.writes.len() - 1].iter().all(|&(_, end)| end % PIECE_BYTES == 0), "{:?}", log.writes);
    }
}
