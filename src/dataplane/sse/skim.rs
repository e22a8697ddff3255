//! The skimmer: the text of an ordinary streaming chunk, read in one pass
//! over its bytes instead of a parse per token.
//!
//! It answers only for chunks it reads exactly as [`super::parse`] does and
//! whose reading needs nothing but the text: one complete JSON object,
//! `choices` with at most one choice (index 0), a `content` or `text`
//! string or null, no tool calls, no log probabilities, no usage, no
//! error. Every other member is skipped, and checked as strictly as the
//! parser checks it (JSON's grammar, string types where the parser borrows
//! a string, no duplicates of a member the parser reads). Anything else is
//! [`Skim::Unsure`] and the caller parses it: being unsure is always safe.
//!
//! A stream's [`Skimmer`] reads most chunks against the last one it read
//! in full, which makes an ordinary chunk a two-comparison read.
//!
//! Architecture Invariant: whenever `skim` or a `Skimmer` answers, a
//! [`super::Transcript`] fed its answer is the one the parse would give
//! (the property tests `the_skimmer_reads_what_the_parser_reads`, over
//! shapes and mutated bytes, and
//! `a_streams_skimmer_reads_each_chunk_as_the_parser_does`, over anything
//! between a template's bytes).

use std::borrow::Cow;
use std::ops::Range;

use super::{data_span, Usage};

/// What a cheap look at one event found (see [`skim`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Skim<'a> {
    /// `data: [DONE]`.
    Done,
    /// An ordinary text chunk: its text (possibly empty) and whether it
    /// carries a `finish_reason`.
    Text { text: Cow<'a, str>, finish: bool },
    /// Anything else (the first chunk, usage, tools, errors, odd shapes):
    /// read it with [`parse`](super::parse).
    Unsure,
}

/// How deep a skipped value may nest before the skimmer gives up (the
/// parser's own limit is 128; being unsure is safe).
const MAX_SKIPPED_DEPTH: u8 = 32;

/// A chunk longer than this is read in full but not kept as a template
/// (ordinary chunks are a few hundred bytes).
const MAX_TEMPLATE_BYTES: usize = 4096;

/// Reads one event (as [`super::events`] yields it) on its own.
pub fn skim(event: &[u8]) -> Skim<'_> {
    read(event).0
}

/// Skims one stream's events, most of them by comparison with the last
/// chunk it read in full. A server's ordinary chunks differ only in their
/// text (the same id, model, created and shape around it), so an event
/// made of that chunk's bytes before its text, one whole JSON string, and
/// that chunk's bytes after its text says what that chunk said, with this
/// text: replacing one JSON string with another changes no structure.
/// Two byte comparisons and the text's scan, instead of a walk over the
/// whole chunk; anything else is read in full.
#[derive(Default)]
pub struct Skimmer {
    template: Option<Template>,
}

/// A chunk read in full: its bytes, where its text's string stands
/// (quotes included), and whether it finished the answer.
#[derive(Default)]
struct Template {
    event: Vec<u8>,
    text: Range<usize>,
    finish: bool,
}

impl Skimmer {
    pub fn skim<'e>(&mut self, event: &'e [u8]) -> Skim<'e> {
        if let Some(answer) = self.again(event) {
            return answer;
        }
        let (answer, text) = read(event);
        if let (Skim::Text { finish, .. }, Some(text)) = (&answer, text) {
            if event.len() <= MAX_TEMPLATE_BYTES {
                // The buffer is kept from one template to the next.
                let t = self.template.get_or_insert_with(Template::default);
                t.event.clear();
                t.event.extend_from_slice(event);
                t.text = text;
                t.finish = *finish;
            }
        }
        answer
    }

    /// The event read against the template: its bytes around the text are
    /// the template's, and what lies between is one whole string.
    fn again<'e>(&self, event: &'e [u8]) -> Option<Skim<'e>> {
        let t = self.template.as_ref()?;
        // Through the opening quote; from the closing quote.
        let (head, tail) = (&t.event[..t.text.start + 1], &t.event[t.text.end - 1..]);
        let string_end = event.len().checked_sub(tail.len() - 1)?;
        if string_end <= head.len() || !event.starts_with(head) || !event.ends_with(tail) {
            return None;
        }
        let mut s = Scanner {
            data: &event[..string_end],
            at: head.len(),
        };
        let text = s.string_rest(head.len() - 1)?;
        // The string's closing quote is the tail's first byte.
        (s.at == string_end).then_some(())?;
        Some(Skim::Text {
            text: s.decode(text)?,
            finish: t.finish,
        })
    }
}

/// One event read in full, and where its text's string stands when the
/// text is one.
fn read(event: &[u8]) -> (Skim<'_>, Option<Range<usize>>) {
    let Some(span) = data_span(event) else {
        return (Skim::Unsure, None);
    };
    if event[span.clone()].trim_ascii() == b"[DONE]" {
        return (Skim::Done, None);
    }
    let mut s = Scanner {
        data: &event[..span.end],
        at: span.start,
    };
    let Some((text, finish)) = s.chunk().filter(|_| s.at_end()) else {
        return (Skim::Unsure, None);
    };
    let Some(text) = text else {
        let empty = Skim::Text {
            text: Cow::Borrowed(""),
            finish,
        };
        return (empty, None);
    };
    match s.decode(text) {
        Some(t) => (Skim::Text { text: t, finish }, Some(text.start..text.end)),
        None => (Skim::Unsure, None),
    }
}

/// The `usage` of a whole JSON answer whose last `"usage"` key ends at
/// `at`, read from there only (see [`super::body_usage`]): `Some` when
/// what follows is its value then members up to the object's closing
/// brace at the end of the body, read as the parser would read them;
/// `None` when it is anything else (a nested key, a string, a shape this
/// scanner does not read): the caller parses the body whole.
pub(super) fn usage_at_end(body: &[u8], at: usize) -> Option<Option<Usage>> {
    let mut s = Scanner { data: body, at };
    s.expect(b':')?;
    let usage = if s.null() {
        None
    } else {
        s.expect(b'{')?;
        Some(s.usage()?)
    };
    s.members_rest(|s, _| s.skip(MAX_SKIPPED_DEPTH))?;
    s.at_end().then_some(usage)
}

/// A JSON string as scanned: where it starts (its opening quote) and ends
/// (after its closing quote), whether it holds escapes, and whether it is
/// all ASCII.
#[derive(Clone, Copy)]
struct Str {
    start: usize,
    end: usize,
    escaped: bool,
    ascii: bool,
}

/// The bytes a string's scan passes over without a second look: not a
/// quote, a backslash, a control byte or a byte of a multi-byte character.
static PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = 0x20;
    while b < 0x80 {
        plain[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    plain
};

/// A cursor over one chunk's JSON. Every method returns `None` when the
/// bytes are not what it reads (the skimmer is then unsure).
struct Scanner<'a> {
    data: &'a [u8],
    at: usize,
}

/// Members read at most once (the parser refuses a duplicate of any member
/// it reads): one bit each.
#[derive(Default)]
struct Seen(u16);

impl Seen {
    fn first(&mut self, member: u16) -> Option<()> {
        let fresh = self.0 & member == 0;
        self.0 |= member;
        fresh.then_some(())
    }

    fn has(&self, member: u16) -> bool {
        self.0 & member != 0
    }
}

const ID: u16 = 1;
const MODEL: u16 = 1 << 1;
const CREATED: u16 = 1 << 2;
const CHOICES: u16 = 1 << 3;
const USAGE: u16 = 1 << 4;
const INDEX: u16 = 1 << 5;
const DELTA: u16 = 1 << 6;
const TEXT: u16 = 1 << 7;
const FINISH: u16 = 1 << 8;
const LOGPROBS: u16 = 1 << 9;
const CONTENT: u16 = 1 << 10;
const TOOL_CALLS: u16 = 1 << 11;
const FUNCTION_CALL: u16 = 1 << 12;

/// What one choice says: its delta's content, its own text (checked, not
/// yet decoded), its finish.
#[derive(Default)]
struct Choice {
    content: Option<Str>,
    text: Option<Str>,
    finish: bool,
}

impl<'a> Scanner<'a> {
    /// The string the chunk's text is (`None`: none or null) and whether
    /// it finishes.
    fn chunk(&mut self) -> Option<(Option<Str>, bool)> {
        self.expect(b'{')?;
        let mut seen = Seen::default();
        let mut choice = None;
        self.members(|s, key| match key {
            b"id" | b"model" => {
                seen.first(if key == b"id" { ID } else { MODEL })?;
                s.string_or_null().map(drop)
            }
            b"created" => {
                seen.first(CREATED)?;
                if !s.null() {
                    s.uint()?;
                }
                Some(())
            }
            b"choices" => {
                seen.first(CHOICES)?;
                s.expect(b'[')?;
                s.elements(|s| {
                    // A second choice: the parser's.
                    if choice.is_some() {
                        return None;
                    }
                    choice = Some(s.choice()?);
                    Some(())
                })
            }
            b"usage" => {
                seen.first(USAGE)?;
                s.null().then_some(())
            }
            b"error" => None,
            _ => s.skip(MAX_SKIPPED_DEPTH),
        })?;
        // A chunk without choices is odd: the parser's.
        seen.has(CHOICES).then_some(())?;
        let c = choice.unwrap_or_default();
        Some((c.content.or(c.text), c.finish))
    }

    /// One choice, `[` or `,` already read.
    fn choice(&mut self) -> Option<Choice> {
        self.expect(b'{')?;
        let mut seen = Seen::default();
        let mut c = Choice::default();
        self.members(|s, key| match key {
            b"index" => {
                seen.first(INDEX)?;
                // Another index is a second answer: not plain text.
                (s.uint()? == 0).then_some(())
            }
            b"delta" => {
                seen.first(DELTA)?;
                if s.null() {
                    return Some(());
                }
                s.expect(b'{')?;
                let mut delta = Seen::default();
                s.members(|s, key| match key {
                    b"content" => {
                        delta.first(CONTENT)?;
                        c.content = s.string_or_null()?;
                        Some(())
                    }
                    b"tool_calls" | b"function_call" => {
                        let bit = if key == b"tool_calls" {
                            TOOL_CALLS
                        } else {
                            FUNCTION_CALL
                        };
                        delta.first(bit)?;
                        s.null().then_some(())
                    }
                    _ => s.skip(MAX_SKIPPED_DEPTH),
                })
            }
            b"text" => {
                seen.first(TEXT)?;
                c.text = s.string_or_null()?;
                Some(())
            }
            b"finish_reason" => {
                seen.first(FINISH)?;
                c.finish = s.string_or_null()?.is_some();
                Some(())
            }
            b"logprobs" => {
                seen.first(LOGPROBS)?;
                s.null().then_some(())
            }
            _ => s.skip(MAX_SKIPPED_DEPTH),
        })?;
        Some(c)
    }

    /// An object's members, its `{` already read, through its `}`: `member`
    /// reads each value.
    fn members(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        if self.eat(b'}') {
            return Some(());
        }
        let key = self.key()?;
        self.expect(b':')?;
        member(self, key)?;
        self.members_rest(member)
    }

    /// The members after one already read, through the object's `}`.
    fn members_rest(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>,
    ) -> Option<()> {
        loop {
            if self.eat(b'}') {
                return Some(());
            }
            self.expect(b',')?;
            let key = self.key()?;
            self.expect(b':')?;
            member(self, key)?;
        }
    }

    /// A `usage` object, its `{` already read, as the parser's [`Usage`]
    /// reads it: each count at most once, a missing one 0, other members
    /// skipped.
    fn usage(&mut self) -> Option<Usage> {
        const PROMPT: u16 = 1;
        const COMPLETION: u16 = 1 << 1;
        let mut seen = Seen::default();
        let mut usage = Usage::default();
        self.members(|s, key| match key {
            b"prompt_tokens" => {
                seen.first(PROMPT)?;
                usage.prompt_tokens = s.uint()?;
                Some(())
            }
            b"completion_tokens" => {
                seen.first(COMPLETION)?;
                usage.completion_tokens = s.uint()?;
                Some(())
            }
            _ => s.skip(MAX_SKIPPED_DEPTH),
        })?;
        Some(usage)
    }

    /// An array's elements, its `[` already read, through its `]`.
    fn elements(&mut self, mut element: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.eat(b']') {
            return Some(());
        }
        loop {
            element(self)?;
            if self.eat(b']') {
                return Some(());
            }
            self.expect(b',')?;
        }
    }

    /// A key as written. A key with escapes or non-ASCII bytes could spell a
    /// member's name another way: unsure.
    fn key(&mut self) -> Option<&'a [u8]> {
        let s = self.string()?;
        (!s.escaped && s.ascii).then_some(&self.data[s.start + 1..s.end - 1])
    }

    /// A checked string's text.
    fn decode(&self, s: Str) -> Option<Cow<'a, str>> {
        if s.escaped {
            let quoted = &self.data[s.start..s.end];
            return serde_json::from_slice::<String>(quoted)
                .ok()
                .map(Cow::Owned);
        }
        std::str::from_utf8(&self.data[s.start + 1..s.end - 1])
            .ok()
            .map(Cow::Borrowed)
    }

    /// A string (checked as text, as the parser's `&str` and `Cow<str>`
    /// members are) or null.
    fn string_or_null(&mut self) -> Option<Option<Str>> {
        if self.null() {
            return Some(None);
        }
        let s = self.string()?;
        if s.escaped {
            serde_json::from_slice::<Cow<'_, str>>(&self.data[s.start..s.end]).ok()?;
        } else if !s.ascii {
            std::str::from_utf8(&self.data[s.start + 1..s.end - 1]).ok()?;
        }
        Some(Some(s))
    }

    /// A string's extent: no control bytes, only JSON's escapes.
    fn string(&mut self) -> Option<Str> {
        self.expect(b'"')?;
        self.string_rest(self.at - 1)
    }

    /// The rest of the string whose opening quote is at `start`.
    fn string_rest(&mut self, start: usize) -> Option<Str> {
        let (mut escaped, mut ascii) = (false, true);
        let data = self.data;
        let mut at = self.at;
        loop {
            at += data
                .get(at..)?
                .iter()
                .position(|b| !PLAIN[usize::from(*b)])?;
            match data[at] {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    at += match *data.get(at + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 2,
                        b'u' => {
                            let hex = data.get(at + 2..at + 6)?;
                            hex.iter().all(u8::is_ascii_hexdigit).then_some(6)?
                        }
                        _ => return None,
                    };
                }
                0x80.. => {
                    ascii = false;
                    at += 1;
                }
                // A control byte.
                _ => return None,
            }
        }
        self.at = at + 1;
        Some(Str {
            start,
            end: self.at,
            escaped,
            ascii,
        })
    }

    /// A non-negative integer that fits a `u64` (what the parser's `u64`
    /// fields take).
    fn uint(&mut self) -> Option<u64> {
        let start = self.at_value();
        self.number()?;
        self.data[start..self.at].iter().try_fold(0u64, |n, d| {
            let digit = d.checked_sub(b'0').filter(|d| *d <= 9)?;
            n.checked_mul(10)?.checked_add(u64::from(digit))
        })
    }

    /// A number by JSON's grammar.
    fn number(&mut self) -> Option<()> {
        self.at_value();
        self.eat_raw(b'-');
        match self.data.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat_raw(b'.') {
            self.some_digits()?;
        }
        if self.eat_raw(b'e') || self.eat_raw(b'E') {
            if !self.eat_raw(b'+') {
                self.eat_raw(b'-');
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn some_digits(&mut self) -> Option<()> {
        let from = self.at;
        self.digits();
        (self.at > from).then_some(())
    }

    fn digits(&mut self) {
        while self.data.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
    }

    /// Any JSON value, checked and passed over.
    fn skip(&mut self, depth: u8) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' | b'[' => {
                let depth = depth.checked_sub(1)?;
                if self.eat(b'{') {
                    self.members(|s, _| s.skip(depth))
                } else {
                    self.expect(b'[')?;
                    self.elements(|s| s.skip(depth))
                }
            }
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.number(),
        }
    }

    /// Reads `null` if it comes next.
    fn null(&mut self) -> bool {
        self.word(b"null").is_some()
    }

    fn word(&mut self, word: &[u8]) -> Option<()> {
        let at = self.at_value();
        self.data.get(at..)?.starts_with(word).then_some(())?;
        self.at += word.len();
        Some(())
    }

    /// Skips whitespace; the position of what follows.
    fn at_value(&mut self) -> usize {
        while matches!(self.data.get(self.at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
        self.at
    }

    fn peek(&mut self) -> Option<u8> {
        let at = self.at_value();
        self.data.get(at).copied()
    }

    /// Reads `byte` if it comes next (after whitespace).
    fn eat(&mut self, byte: u8) -> bool {
        self.at_value();
        self.eat_raw(byte)
    }

    /// Reads `byte` if it comes next, whitespace not skipped (inside a
    /// number).
    fn eat_raw(&mut self, byte: u8) -> bool {
        let next = self.data.get(self.at) == Some(&byte);
        self.at += usize::from(next);
        next
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    /// Nothing but whitespace is left.
    fn at_end(&mut self) -> bool {
        self.at_value() == self.data.len()
    }
}
