//! Stop strings over streamed text: text is released only once it cannot be the start
//! of a stop string, and generation ends at the first full match (which is not returned).

/// Stop-string matcher for one sequence.
#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    /// Decoded text not yet released: a suffix that may still grow into a stop string.
    held: String,
}

impl StopText {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Add newly decoded text. Returns the text that is now safe to release and whether a
    /// stop string matched (then the text before it is the last to release).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .map_or(0, |i| self.held.len() - i);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// The end of generation without a match: whatever was held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopText;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = s.push(p);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&s.finish());
        (out, false)
    }

    #[test]
    fn stops_at_the_first_match_across_pieces() {
        assert_eq!(run(&["\n\n"], &["Hello", " world", "\n", "\nmore"]), ("Hello world".into(), true));
        assert_eq!(run(&["END", "the"], &["in ", "th", "e END"]), ("in ".into(), true));
        assert_eq!(run(&["xyz"], &["abc", "xy", "q"]), ("abcxyq".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a"]), ("a".into(), false));
    }

    #[test]
    fn holds_back_only_possible_prefixes() {
        let mut s = StopText::new(vec!["STOP".into()]);
        assert_eq!(s.push("abcST"), ("abc".into(), false));
        assert_eq!(s.push("x"), ("STx".into(), false));
        assert_eq!(s.push("é S"), ("é ".into(), false));
        assert_eq!(s.push("TOP!"), ("".into(), true));
    }
}
