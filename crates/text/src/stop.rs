//! `StopMatcher`: stop sequences over a stream of text deltas.

/// A stop sequence was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopHit {
    /// Index of the stop sequence in the list given to [`StopMatcher::new`].
    pub index: usize,
    /// The stop sequence.
    pub stop: String,
}

/// What one delta gave.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that can be emitted now: it holds no stop sequence and no beginning of one.
    pub text: String,
    /// Set when a stop sequence was found; generation ends, `text` is what came before it.
    pub stopped: Option<StopHit>,
}

/// Finds stop sequences in generated text, which arrives in pieces. No part of a stop
/// sequence is ever let through: text that might be the beginning of one is held back until
/// the following text settles it. `Send + Sync`, one per generation.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored.
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        StopMatcher {
            stops: stops.iter().map(|s| s.as_ref().to_owned()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Feeds the next delta. After a stop was reported, all further text is dropped.
    pub fn push(&mut self, delta: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome::default();
        }
        self.held.push_str(delta);
        if let Some((at, index)) = self.first_match() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return StopOutcome {
                text,
                stopped: Some(StopHit {
                    index,
                    stop: self.stops[index].clone(),
                }),
            };
        }
        let keep = self.longest_partial_suffix();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        StopOutcome {
            text,
            stopped: None,
        }
    }

    /// Ends the stream: returns the text held back (it turned out not to be a stop sequence).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Whether a stop sequence was found.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The earliest occurrence of any stop sequence in the held text: (byte offset, index).
    /// At equal offsets the longer stop wins, so that no piece of it is emitted.
    fn first_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter(|(_, stop)| !stop.is_empty())
            .filter_map(|(index, stop)| self.held.find(stop.as_str()).map(|at| (at, index)))
            .min_by_key(|&(at, index)| (at, std::cmp::Reverse(self.stops[index].len())))
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop
    /// sequence (always ends on a character boundary).
    fn longest_partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        let longest_stop = self.stops.iter().map(String::len).max().unwrap_or(0);
        let start_min = held.len().saturating_sub(longest_stop.saturating_sub(1));
        (start_min..held.len())
            .filter(|&start| held.is_char_boundary(start))
            .find(|&start| {
                let suffix = &held[start..];
                self.stops.iter().any(|stop| stop.starts_with(suffix))
            })
            .map_or(0, |start| held.len() - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `deltas`, returns (emitted text, stop index, flushed rest). Checks on the way
    /// that the text emitted so far is always a prefix of the right final answer (the text
    /// before the earliest stop), so no piece of a stop sequence ever leaks.
    fn run(stops: &[&str], deltas: &[&str]) -> (String, Option<usize>, String) {
        let whole: String = deltas.concat();
        let expected_end = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| whole.find(s))
            .min()
            .unwrap_or(whole.len());
        let mut matcher = StopMatcher::new(stops);
        let mut out = String::new();
        for delta in deltas {
            let outcome = matcher.push(delta);
            out.push_str(&outcome.text);
            assert!(whole[..expected_end].starts_with(&out), "leaked: {out:?}");
            if let Some(hit) = outcome.stopped {
                assert_eq!(hit.stop, stops[hit.index]);
                assert_eq!(out.len(), expected_end);
                return (out, Some(hit.index), matcher.finish());
            }
        }
        let rest = matcher.finish();
        (out, None, rest)
    }

    #[test]
    fn random_splits_never_leak_a_stop() {
        let text = "The end is near. <|im_end|> after <|im_end|>";
        let stops = ["<|im_end|>", "near!", "is ne"];
        let mut seed = 7u64;
        for _ in 0..500 {
            let mut deltas = Vec::new();
            let mut rest = text;
            while !rest.is_empty() {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let mut cut = 1 + (seed >> 33) as usize % 5;
                while cut < rest.len() && !rest.is_char_boundary(cut) {
                    cut += 1;
                }
                let cut = cut.min(rest.len());
                deltas.push(&rest[..cut]);
                rest = &rest[cut..];
            }
            let (out, stop, _) = run(&stops, &deltas);
            assert_eq!((out.as_str(), stop), ("The end ", Some(2)));
        }
    }

    #[test]
    fn no_stops_passes_everything_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), None, "".into()));
    }

    #[test]
    fn stop_inside_one_delta() {
        assert_eq!(
            run(&["END"], &["hello END world"]),
            ("hello ".into(), Some(0), "".into())
        );
    }

    #[test]
    fn stop_spanning_many_deltas_is_never_emitted_in_part() {
        let mut matcher = StopMatcher::new(&["<|end|>"]);
        assert_eq!(matcher.push("Hi <").text, "Hi ");
        assert_eq!(matcher.push("|e").text, "");
        assert_eq!(matcher.push("n").text, "");
        let outcome = matcher.push("d|> more");
        assert_eq!(outcome.text, "");
        assert_eq!(outcome.stopped.unwrap().stop, "<|end|>");
        assert!(matcher.is_stopped());
        assert_eq!(matcher.push("ignored"), StopOutcome::default());
    }

    #[test]
    fn a_false_start_is_released() {
        assert_eq!(
            run(&["STOP"], &["ST", "OR", "Y"]),
            ("STORY".into(), None, "".into())
        );
        // Held text that never became a stop comes out at the end.
        assert_eq!(
            run(&["STOP"], &["a", "ST"]),
            ("a".into(), None, "ST".into())
        );
    }

    #[test]
    fn overlapping_partials_keep_the_longest() {
        // "aab" is the stop; "aaab" must stop after "a".
        assert_eq!(
            run(&["aab"], &["a", "a", "a", "b", "c"]),
            ("a".into(), Some(0), "".into())
        );
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo w"], &["hel", "lo wor", "ld"]),
            ("hel".into(), Some(1), "".into())
        );
        assert_eq!(
            run(&["ab", "abc"], &["xabc"]),
            ("x".into(), Some(1), "".into())
        );
    }

    #[test]
    fn multibyte_text_is_split_on_char_boundaries() {
        assert_eq!(
            run(&["é!"], &["café", "!"]),
            ("caf".into(), Some(0), "".into())
        );
        assert_eq!(
            run(&["😀x"], &["a😀", "😀", "y"]),
            ("a😀😀y".into(), None, "".into())
        );
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), None, "".into()));
    }
}
