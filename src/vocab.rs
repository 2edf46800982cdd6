//! A whitespace vocabulary: words to ids and back.
//!
//! The examples (and users who tokenize by whitespace) need ids to feed the
//! kernels. [`Vocab`] is the smallest thing that gives them: it splits text
//! on Unicode whitespace ([`str::split_whitespace`]), counts the words, and
//! numbers them.
//!
//! ```
//! use embedding_kernels::vocab::{Vocab, EOS, SOS, UNK};
//!
//! let vocab = Vocab::from_text("the cat sat on the mat");
//! assert_eq!(vocab.id("the"), Some(4)); // the most frequent word comes first
//! assert_eq!(vocab.encode("the dog"), vec![4, UNK]);
//! assert_eq!(vocab.encode_with_specials("the cat"), vec![SOS, 4, 5, EOS]);
//! assert_eq!(vocab.decode(&[4, 5, UNK]), "the cat <unk>");
//! ```
//!
//! # Ids
//!
//! The four special tokens always hold the first four ids:
//!
//! | id | constant | token |
//! | ---: | --- | --- |
//! | 0 | [`PAD`] | [`PAD_TOKEN`] `<pad>` |
//! | 1 | [`UNK`] | [`UNK_TOKEN`] `<unk>` |
//! | 2 | [`SOS`] | [`SOS_TOKEN`] `<sos>` |
//! | 3 | [`EOS`] | [`EOS_TOKEN`] `<eos>` |
//!
//! Every other distinct word gets an id from 4 on, in **descending count,
//! ties broken by first appearance** in the text. The rule depends on the
//! text alone (not on hashing), so the same text always gives the same ids.
//! A special token's string found in the text keeps its special id and is
//! not added a second time.

use std::collections::HashMap;
use std::iter::FusedIterator;

/// The id of the padding token [`PAD_TOKEN`].
pub const PAD: u32 = 0;
/// The id of the unknown-word token [`UNK_TOKEN`], which [`Vocab::encode`]
/// gives every word it does not know.
pub const UNK: u32 = 1;
/// The id of the start-of-sequence token [`SOS_TOKEN`].
pub const SOS: u32 = 2;
/// The id of the end-of-sequence token [`EOS_TOKEN`].
pub const EOS: u32 = 3;

/// The padding token, id [`PAD`].
pub const PAD_TOKEN: &str = "<pad>";
/// The unknown-word token, id [`UNK`].
pub const UNK_TOKEN: &str = "<unk>";
/// The start-of-sequence token, id [`SOS`].
pub const SOS_TOKEN: &str = "<sos>";
/// The end-of-sequence token, id [`EOS`].
pub const EOS_TOKEN: &str = "<eos>";

/// The special tokens, indexed by their ids.
pub const SPECIAL_TOKENS: [&str; 4] = [PAD_TOKEN, UNK_TOKEN, SOS_TOKEN, EOS_TOKEN];

/// A vocabulary of whitespace-separated words, with the special tokens
/// `<pad>` = 0, `<unk>` = 1, `<sos>` = 2 and `<eos>` = 3 first.
///
/// Words get the ids 4, 5, … in **descending count, ties broken by first
/// appearance** in the text they were built from: in `"b a c a"`, `a` (twice)
/// is 4, then `b` is 5 and `c` is 6 (once each, `b` seen first). A special
/// token's string in the text maps to its special id and is not added again.
///
/// A vocabulary is never empty: it holds at least the four special tokens.
/// Built from more than `u32::MAX - 4` distinct words (which no machine has
/// the memory for), the ones last in the order above are left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocab {
    /// Token to id.
    ids: HashMap<String, u32>,
    /// Id to token.
    tokens: Vec<String>,
    /// Id to how often the token appeared in the text the vocabulary was
    /// built from.
    counts: Vec<usize>,
}

impl Vocab {
    /// Builds a vocabulary from every word of `text` (split on Unicode
    /// whitespace).
    pub fn from_text(text: &str) -> Self {
        Self::from_tokens_with_min_freq(text.split_whitespace(), 1)
    }

    /// Builds a vocabulary from the words of `text` (split on Unicode
    /// whitespace) that appear at least `min_freq` times; rarer words are
    /// left out and so encode as [`UNK`]. A `min_freq` of 0 or 1 keeps every
    /// word. The special tokens are always kept.
    pub fn from_text_with_min_freq(text: &str, min_freq: usize) -> Self {
        Self::from_tokens_with_min_freq(text.split_whitespace(), min_freq)
    }

    /// Builds a vocabulary from tokens that are already split. Each item is
    /// taken as one token, as is: it is not split again or trimmed.
    pub fn from_tokens<'a, I>(tokens: I) -> Self
    where
        I: IntoIterator<Item = &'a str>,
    {
        Self::from_tokens_with_min_freq(tokens, 1)
    }

    /// Builds a vocabulary from the tokens that appear at least `min_freq`
    /// times (see [`from_text_with_min_freq`](Self::from_text_with_min_freq)).
    pub fn from_tokens_with_min_freq<'a, I>(tokens: I, min_freq: usize) -> Self
    where
        I: IntoIterator<Item = &'a str>,
    {
        let mut special_counts = [0usize; SPECIAL_TOKENS.len()];
        // Token to (count, position of its first appearance).
        let mut seen: HashMap<&str, (usize, usize)> = HashMap::new();
        for (position, token) in tokens.into_iter().enumerate() {
            if let Some(special) = SPECIAL_TOKENS.iter().position(|&s| s == token) {
                special_counts[special] += 1;
            } else {
                seen.entry(token).or_insert((0, position)).0 += 1;
            }
        }

        let mut words: Vec<(&str, usize, usize)> = seen
            .into_iter()
            .filter(|&(_, (count, _))| count >= min_freq)
            .map(|(token, (count, first))| (token, count, first))
            .collect();
        // First appearances are distinct, so this order is total: the result
        // does not depend on the HashMap's iteration order.
        words.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        // Ids 4..u32::MAX (u32::MAX itself stays free, so the id counter
        // below never steps past it).
        words.truncate(u32::MAX as usize - SPECIAL_TOKENS.len());

        let len = SPECIAL_TOKENS.len() + words.len();
        let mut vocab = Vocab {
            ids: HashMap::with_capacity(len),
            tokens: Vec::with_capacity(len),
            counts: Vec::with_capacity(len),
        };
        let specials = SPECIAL_TOKENS.into_iter().zip(special_counts);
        let words = words.into_iter().map(|(token, count, _)| (token, count));
        for ((token, count), id) in specials.chain(words).zip(0u32..) {
            vocab.ids.insert(token.to_owned(), id);
            vocab.tokens.push(token.to_owned());
            vocab.counts.push(count);
        }
        vocab
    }

    /// The ids of the words of `text` (split on Unicode whitespace); a word
    /// the vocabulary does not hold gives [`UNK`]. A special token's string
    /// gives its special id.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.word_ids(text).collect()
    }

    /// [`encode`](Self::encode), wrapped in [`SOS`] … [`EOS`].
    pub fn encode_with_specials(&self, text: &str) -> Vec<u32> {
        let mut ids = vec![SOS];
        ids.extend(self.word_ids(text));
        ids.push(EOS);
        ids
    }

    /// The ids of the words of `text`, [`UNK`] for the unknown ones.
    fn word_ids<'s>(&'s self, text: &'s str) -> impl Iterator<Item = u32> + 's {
        text.split_whitespace()
            .map(|word| self.id(word).unwrap_or(UNK))
    }

    /// The tokens of `ids` joined by single spaces. Special ids decode to
    /// their strings (`<pad>`, …); an id the vocabulary does not hold
    /// (`id >= self.len()`) decodes to `<unk>`.
    ///
    /// For text made of known words, `decode(&encode(text))` is the words of
    /// `text` joined by single spaces.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut text = String::new();
        for (i, &id) in ids.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(self.token(id).unwrap_or(UNK_TOKEN));
        }
        text
    }

    /// The id of `token`, if the vocabulary holds it.
    pub fn id(&self, token: &str) -> Option<u32> {
        self.ids.get(token).copied()
    }

    /// The token with id `id`, if there is one.
    pub fn token(&self, id: u32) -> Option<&str> {
        let index = usize::try_from(id).ok()?;
        self.tokens.get(index).map(String::as_str)
    }

    /// How many times `token` appeared in the text the vocabulary was built
    /// from, or `None` if the vocabulary does not hold it. The special tokens
    /// are always held: their count is how often their strings appeared
    /// (usually 0).
    pub fn count(&self, token: &str) -> Option<usize> {
        let id = self.id(token)?;
        self.counts.get(usize::try_from(id).ok()?).copied()
    }

    /// The number of tokens, the four special ones included; ids run from 0
    /// to `len() - 1`.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always `false`: a vocabulary holds at least the four special tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens in id order, the special ones first.
    pub fn iter(&self) -> Tokens<'_> {
        Tokens {
            inner: self.tokens.iter(),
        }
    }
}

impl Default for Vocab {
    /// The four special tokens only, as built from empty text.
    fn default() -> Self {
        Self::from_text("")
    }
}

impl<'a> IntoIterator for &'a Vocab {
    type Item = &'a str;
    type IntoIter = Tokens<'a>;

    fn into_iter(self) -> Tokens<'a> {
        self.iter()
    }
}

/// The tokens of a [`Vocab`] in id order, from [`Vocab::iter`].
#[derive(Clone, Debug)]
pub struct Tokens<'a> {
    inner: std::slice::Iter<'a, String>,
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        self.inner.next().map(String::as_str)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl DoubleEndedIterator for Tokens<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(String::as_str)
    }
}

impl ExactSizeIterator for Tokens<'_> {}

impl FusedIterator for Tokens<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specials_hold_the_first_four_ids() {
        let vocab = Vocab::from_text("hello world");
        assert_eq!((PAD, UNK, SOS, EOS), (0, 1, 2, 3));
        assert_eq!(vocab.token(0), Some("<pad>"));
        assert_eq!(vocab.token(1), Some("<unk>"));
        assert_eq!(vocab.token(2), Some("<sos>"));
        assert_eq!(vocab.token(3), Some("<eos>"));
        assert_eq!(vocab.id("<pad>"), Some(0));
        assert_eq!(vocab.id("<unk>"), Some(1));
        assert_eq!(vocab.id("<sos>"), Some(2));
        assert_eq!(vocab.id("<eos>"), Some(3));
    }

    #[test]
    fn empty_text_gives_the_four_specials() {
        for text in ["", "   \t\n  "] {
            let vocab = Vocab::from_text(text);
            assert_eq!(vocab.len(), 4);
            assert!(!vocab.is_empty());
            let tokens: Vec<&str> = vocab.iter().collect();
            assert_eq!(tokens, ["<pad>", "<unk>", "<sos>", "<eos>"]);
            assert_eq!(vocab.token(4), None);
        }
        assert_eq!(Vocab::default(), Vocab::from_text(""));
        assert_eq!(Vocab::from_tokens([]).len(), 4);
    }

    #[test]
    fn ids_follow_count_then_first_appearance() {
        // Counts by hand: a 3, b 2, c 1, d 1, e 2. First appearances:
        // b 0, a 1, c 2, e 4, d 8.
        // Descending count: a (3); then b and e (2 each, b first); then c
        // and d (1 each, c first).
        let vocab = Vocab::from_text("b a c a e b a e d");
        let tokens: Vec<&str> = vocab.iter().skip(4).collect();
        assert_eq!(tokens, ["a", "b", "e", "c", "d"]);
        assert_eq!(vocab.id("a"), Some(4));
        assert_eq!(vocab.id("b"), Some(5));
        assert_eq!(vocab.id("e"), Some(6));
        assert_eq!(vocab.id("c"), Some(7));
        assert_eq!(vocab.id("d"), Some(8));
        assert_eq!(vocab.len(), 9);
        assert_eq!(vocab.count("a"), Some(3));
        assert_eq!(vocab.count("e"), Some(2));
        assert_eq!(vocab.count("d"), Some(1));
        assert_eq!(vocab.count("zebra"), None);
    }

    #[test]
    fn all_ties_keep_text_order_not_alphabetical() {
        let vocab = Vocab::from_text("zulu yankee xray zulu yankee xray");
        assert_eq!(vocab.id("zulu"), Some(4));
        assert_eq!(vocab.id("yankee"), Some(5));
        assert_eq!(vocab.id("xray"), Some(6));
    }

    #[test]
    fn whitespace_of_every_kind_splits() {
        let vocab = Vocab::from_text("one\ttwo\nthree  one\u{3000}two one");
        // one 3, two 2, three 1.
        assert_eq!(
            vocab.iter().skip(4).collect::<Vec<_>>(),
            ["one", "two", "three"]
        );
    }

    #[test]
    fn from_tokens_takes_each_item_as_one_token() {
        let vocab = Vocab::from_tokens(["new york", "paris", "paris"]);
        assert_eq!(vocab.id("paris"), Some(4));
        assert_eq!(vocab.id("new york"), Some(5));
        assert_eq!(vocab.id("new"), None);
    }

    #[test]
    fn encode_decode_round_trip_for_known_words() {
        let text = "the cat sat on the mat";
        let vocab = Vocab::from_text(text);
        // the 2 (first 0), cat 1 (1), sat 1 (2), on 1 (3), mat 1 (5).
        let ids = vocab.encode(text);
        assert_eq!(ids, [4, 5, 6, 7, 4, 8]);
        assert_eq!(vocab.decode(&ids), text);
        assert_eq!(
            vocab.decode(&vocab.encode("  mat\t on\nthe ")),
            "mat on the"
        );
        assert_eq!(vocab.encode_with_specials("cat sat"), [2, 5, 6, 3]);
        assert_eq!(vocab.decode(&[2, 5, 6, 3, 0]), "<sos> cat sat <eos> <pad>");
        assert_eq!(vocab.encode(""), Vec::<u32>::new());
        assert_eq!(vocab.encode_with_specials(""), [2, 3]);
        assert_eq!(vocab.decode(&[]), "");
    }

    #[test]
    fn unknown_words_encode_to_unk() {
        let vocab = Vocab::from_text("the cat");
        assert_eq!(vocab.encode("the dog cat Cat"), [4, 1, 5, 1]);
        assert_eq!(vocab.encode_with_specials("dog"), [2, 1, 3]);
    }

    #[test]
    fn out_of_range_ids_decode_to_unk() {
        let vocab = Vocab::from_text("the cat");
        assert_eq!(vocab.len(), 6);
        assert_eq!(vocab.decode(&[4, 6, u32::MAX, 5]), "the <unk> <unk> cat");
        assert_eq!(vocab.token(6), None);
        assert_eq!(vocab.token(u32::MAX), None);
    }

    #[test]
    fn specials_in_text_are_not_added_twice() {
        let vocab = Vocab::from_text("<unk> hi <eos> hi <pad> <unk> yo");
        assert_eq!(vocab.len(), 6);
        assert_eq!(
            vocab.iter().collect::<Vec<_>>(),
            ["<pad>", "<unk>", "<sos>", "<eos>", "hi", "yo"]
        );
        assert_eq!(vocab.count("<unk>"), Some(2));
        assert_eq!(vocab.count("<eos>"), Some(1));
        assert_eq!(vocab.count("<sos>"), Some(0));
        assert_eq!(vocab.encode("<eos> hi <pad>"), [3, 4, 0]);
    }

    #[test]
    fn min_freq_drops_rare_words() {
        // a 2, b 1, c 3.
        let text = "a a b c c c";
        let vocab = Vocab::from_text_with_min_freq(text, 2);
        assert_eq!(vocab.len(), 6);
        assert_eq!(vocab.id("c"), Some(4));
        assert_eq!(vocab.id("a"), Some(5));
        assert_eq!(vocab.id("b"), None);
        assert_eq!(vocab.encode("b a"), [1, 5]);
        assert_eq!(vocab.count("b"), None);
        // 0 and 1 keep everything; a threshold above every count keeps the
        // specials only.
        assert_eq!(
            Vocab::from_text_with_min_freq(text, 0),
            Vocab::from_text(text)
        );
        assert_eq!(Vocab::from_text_with_min_freq(text, 1).len(), 7);
        assert_eq!(Vocab::from_text_with_min_freq(text, 4).len(), 4);
    }

    #[test]
    fn iteration_is_in_id_order() {
        let vocab = Vocab::from_text("y x x");
        let forward: Vec<&str> = (&vocab).into_iter().collect();
        assert_eq!(forward, ["<pad>", "<unk>", "<sos>", "<eos>", "x", "y"]);
        assert_eq!(vocab.iter().len(), 6);
        assert_eq!(vocab.iter().next_back(), Some("y"));
        for (id, token) in (0u32..).zip(&vocab) {
            assert_eq!(vocab.id(token), Some(id));
        }
    }

    #[test]
    fn same_text_same_vocab() {
        let text = "q w e r t y u i o p a s d f g h j k l z x c v b n m q w e";
        let first = Vocab::from_text(text);
        for _ in 0..8 {
            assert_eq!(
                Vocab::from_text(text).iter().collect::<Vec<_>>(),
                first.iter().collect::<Vec<_>>()
            );
        }
        assert_eq!(first.id("q"), Some(4));
        assert_eq!(first.id("w"), Some(5));
        assert_eq!(first.id("e"), Some(6));
        assert_eq!(first.id("r"), Some(7));
        assert_eq!(first.id("m"), Some(29));
    }
}
