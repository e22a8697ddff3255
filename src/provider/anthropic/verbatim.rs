//! The hottest shapes translated in one pass over the bytes, strings
//! copied as they were written: a request of plain text turns, an answer
//! of text blocks, a stream's text delta (and, in [`events`], the other
//! events of an ordinary stream). JSON strings are not unescaped
//! and escaped again (serde's typed path spent most of its instructions
//! there and in matching field names); a string is checked instead (no
//! control character, only the escapes `\" \\ \/ \b \f \n \r \t`, the
//! whole body UTF-8) and its bytes go into the output between quotes,
//! which is the same JSON string.
//!
//! Anything else (a `\u` escape, a `null`, a field these shapes do not
//! have, a duplicate field, a value out of range) gives `None`, and the
//! caller takes the typed path, then the `Value` one, which have the last
//! word: this path only ever says what they would say (the tests check it
//! on the golden tables and on random requests and answers).

use smallvec::SmallVec;

use super::fast::{Translated, UsageIn};

pub(super) mod events;
use super::response::{finish_reason, Usage};

/// serde_json's nesting limit: deeper values are not skipped here.
const MAX_DEPTH: usize = 128;

/// A cursor over JSON text.
struct Json<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Json<'a> {
    fn new(b: &'a [u8]) -> Self {
        Self { b, i: 0 }
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Whether the text ends here (whitespace aside).
    fn end(&mut self) -> bool {
        self.ws();
        self.i == self.b.len()
    }

    /// After a member or element: `true` at `,` (another follows), `false`
    /// at `close`.
    fn more(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// `{` and whether a member follows (`false`: `{}`).
    fn open(&mut self, open: u8, close: u8) -> Option<bool> {
        self.eat(open)?;
        if self.peek()? == close {
            self.i += 1;
            return Some(false);
        }
        Some(true)
    }

    /// A member's name (its raw bytes) and the colon after it.
    #[inline(always)]
    fn key(&mut self) -> Option<&'a [u8]> {
        // The usual name, without escapes: one run to its closing quote,
        // its colon right after it (as JSON writers put it); [`Json::key_any`]
        // takes any other.
        self.ws();
        if self.b.get(self.i) == Some(&b'"') {
            let start = self.i + 1;
            self.i = start;
            self.plain_run();
            if self.b.get(self.i) == Some(&b'"') && self.b.get(self.i + 1) == Some(&b':') {
                let k = &self.b[start..self.i];
                self.i += 2;
                return Some(k);
            }
            self.i = start - 1;
        }
        self.key_any()
    }

    #[cold]
    fn key_any(&mut self) -> Option<&'a [u8]> {
        let k = self.string()?;
        self.eat(b':')?;
        Some(k)
    }

    /// The member name at the cursor as its index in `names` (`None`:
    /// another name), the cursor past its colon. A name written as JSON
    /// writers write one, `"name":`, is compared in place with each of
    /// `names` (no scan, no second comparison); any other is read by
    /// [`Json::key`].
    #[inline(always)]
    fn member<const N: usize>(&mut self, names: [&[u8]; N]) -> Option<Option<usize>> {
        self.ws();
        if let Some(rest) = self.b.get(self.i..).and_then(|r| r.strip_prefix(b"\"")) {
            for (k, name) in names.iter().enumerate() {
                if rest
                    .strip_prefix(*name)
                    .is_some_and(|after| after.starts_with(b"\":"))
                {
                    self.i += name.len() + 3;
                    return Some(Some(k));
                }
            }
        }
        let key = self.key()?;
        Some(names.iter().position(|n| *n == key))
    }

    /// A string's bytes between its quotes, escapes as written: only the
    /// escapes copied verbatim mean what they say (no `\u`).
    #[inline(always)]
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        // The usual string, no escape: one run to its closing quote.
        self.plain_run();
        if self.b.get(self.i) == Some(&b'"') {
            self.i += 1;
            return Some(&self.b[start..self.i - 1]);
        }
        self.string_rest(start)
    }

    /// The rest of a string that started at `start` (after its quote).
    #[cold]
    fn string_rest(&mut self, start: usize) -> Option<&'a [u8]> {
        loop {
            self.plain_run();
            match *self.b.get(self.i)? {
                b'"' => {
                    let s = &self.b[start..self.i];
                    self.i += 1;
                    return Some(s);
                }
                b'\\' => match self.b.get(self.i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                    _ => return None,
                },
                0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
    }

    /// Past the bytes a string may hold as they are (no quote, backslash
    /// or control character), eight at a time.
    #[inline(always)]
    fn plain_run(&mut self) {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        // A byte of `v` is zero: that byte's high bit in the result (and
        // maybe some above it, which only stops the run early).
        let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
        while let Some(word) = self.b.get(self.i..self.i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            let v = u64::from_le_bytes(w);
            let special = zero(v ^ (ONES * u64::from(b'"')))
                | zero(v ^ (ONES * u64::from(b'\\')))
                | (v.wrapping_sub(ONES * 0x20) & !v & HIGH);
            if special != 0 {
                // The first such byte (a borrow only flags bytes above it).
                self.i += (special.trailing_zeros() / 8) as usize;
                return;
            }
            self.i += 8;
        }
    }

    /// A string skipped: any valid escape, `\u` with four hex digits.
    #[inline(always)]
    fn skip_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        self.plain_run();
        if self.b.get(self.i) == Some(&b'"') {
            self.i += 1;
            return Some(());
        }
        self.skip_string_rest()
    }

    #[cold]
    fn skip_string_rest(&mut self) -> Option<()> {
        loop {
            self.plain_run();
            match *self.b.get(self.i)? {
                b'"' => {
                    self.i += 1;
                    return Some(());
                }
                b'\\' => match self.b.get(self.i + 1)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 2,
                    b'u' => {
                        let hex = self.b.get(self.i + 2..self.i + 6)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        self.i += 6;
                    }
                    _ => return None,
                },
                0..=0x1f => return None,
                _ => self.i += 1,
            }
        }
    }

    /// A number's text, by JSON's grammar.
    fn number(&mut self) -> Option<&'a [u8]> {
        self.ws();
        let start = self.i;
        let digits = |j: &mut Self| {
            let from = j.i;
            while j.b.get(j.i).is_some_and(u8::is_ascii_digit) {
                j.i += 1;
            }
            j.i > from
        };
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        if self.b.get(self.i) == Some(&b'0') {
            self.i += 1;
        } else if !digits(self) {
            return None;
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if !digits(self) {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if !digits(self) {
                return None;
            }
        }
        Some(&self.b[start..self.i])
    }

    /// A number that is a `u64`: digits without a sign, fraction or
    /// exponent (read once, not scanned by [`Json::number`] first).
    #[inline(always)]
    fn u64(&mut self) -> Option<u64> {
        self.ws();
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(&d) = self.b.get(self.i) {
            if !d.is_ascii_digit() {
                break;
            }
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        // No digit, a leading zero (not JSON), or a number that goes on.
        if digits == 0
            || (digits > 1 && self.b[start] == b'0')
            || matches!(self.b.get(self.i), Some(b'.' | b'e' | b'E'))
        {
            return None;
        }
        Some(n)
    }

    /// `null` (then `None`) or a [`Json::u64`].
    #[inline(always)]
    fn u64_or_null(&mut self) -> Option<Option<u64>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        self.u64().map(Some)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    fn bool(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.literal(b"true").map(|_| true),
            b'f' => self.literal(b"false").map(|_| false),
            _ => None,
        }
    }

    /// Any value, checked as serde checks a value it ignores.
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' => {
                if self.open(b'{', b'}')? {
                    loop {
                        self.skip_string()?;
                        self.eat(b':')?;
                        self.skip(depth + 1)?;
                        if !self.more(b'}')? {
                            break;
                        }
                    }
                }
                Some(())
            }
            b'[' => {
                if self.open(b'[', b']')? {
                    loop {
                        self.skip(depth + 1)?;
                        if !self.more(b']')? {
                            break;
                        }
                    }
                }
                Some(())
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(|_| ()),
        }
    }
}

/// Whether `b` is UTF-8: ASCII (the usual JSON, checked a word at a
/// time with less setup than `from_utf8`'s) or not. For a stream's short
/// events; a whole request or answer is checked by `from_utf8` itself
/// (as fast on a few hundred bytes, measured).
fn utf8(b: &[u8]) -> bool {
    b.is_ascii() || std::str::from_utf8(b).is_ok()
}

/// A field seen twice: serde refuses it, so this path does not guess.
fn once(seen: &mut u32, bit: u32) -> Option<()> {
    (*seen & bit == 0).then(|| *seen |= bit)
}

fn push_u64(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

fn push_str(out: &mut Vec<u8>, raw: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(raw);
    out.push(b'"');
}

/// A string of ours (a model name), escaped as serde_json escapes it:
/// one with nothing to escape (every model name in practice) is copied.
fn push_escaped(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        push_str(out, s.as_bytes());
        return;
    }
    // Writing to a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// A number in 0–1 (`temperature`, `top_p`), read and written as
/// serde_json reads and writes it.
fn unit(j: &mut Json<'_>) -> Option<serde_json::Number> {
    let n: serde_json::Number = serde_json::from_slice(j.number()?).ok()?;
    n.as_f64()
        .is_some_and(|x| (0.0..=1.0).contains(&x))
        .then_some(n)
}

/// The request of `super::fast::simple_request`, for the shapes it
/// takes whose strings need no `\u` and whose fields are not `null`.
pub(super) fn request(
    body: &[u8],
    upstream_model: &str,
    default_max_tokens: u32,
) -> Option<Translated> {
    std::str::from_utf8(body).ok()?;
    let mut j = Json::new(body);
    let mut seen = 0u32;
    let mut system: Option<&[u8]> = None;
    let mut turns: SmallVec<[(&'static str, &[u8]); 8]> = SmallVec::new();
    let (mut max_tokens, mut max_completion_tokens) = (None, None);
    let (mut temperature, mut top_p) = (None, None);
    let mut stream = None;
    let mut include_usage = false;
    let mut stop: Option<SmallVec<[&[u8]; 4]>> = None;
    let mut user = None;
    if j.open(b'{', b'}')? {
        loop {
            let member = j.member([
                b"model",
                b"messages",
                b"max_tokens",
                b"max_completion_tokens",
                b"temperature",
                b"top_p",
                b"stream",
                b"stream_options",
                b"stop",
                b"user",
            ])?;
            match member {
                Some(0) => {
                    once(&mut seen, 1)?;
                    j.string()?;
                }
                Some(1) => {
                    once(&mut seen, 2)?;
                    messages(&mut j, &mut system, &mut turns)?;
                }
                Some(2) => {
                    once(&mut seen, 4)?;
                    max_tokens = Some(j.u64().filter(|n| *n >= 1)?);
                }
                Some(3) => {
                    once(&mut seen, 8)?;
                    max_completion_tokens = Some(j.u64().filter(|n| *n >= 1)?);
                }
                Some(4) => {
                    once(&mut seen, 16)?;
                    temperature = Some(unit(&mut j)?);
                }
                Some(5) => {
                    once(&mut seen, 32)?;
                    top_p = Some(unit(&mut j)?);
                }
                Some(6) => {
                    once(&mut seen, 64)?;
                    stream = Some(j.bool()?);
                }
                Some(7) => {
                    once(&mut seen, 128)?;
                    if j.open(b'{', b'}')? {
                        if j.key()? != b"include_usage" {
                            return None;
                        }
                        include_usage = j.bool()?;
                        j.eat(b'}')?;
                    }
                }
                Some(8) => {
                    once(&mut seen, 256)?;
                    let mut list = SmallVec::new();
                    if j.peek()? == b'"' {
                        list.push(j.string()?);
                    } else if j.open(b'[', b']')? {
                        loop {
                            list.push(j.string()?);
                            if !j.more(b']')? {
                                break;
                            }
                        }
                    }
                    // An empty list is no stop sequence at all.
                    stop = (!list.is_empty()).then_some(list);
                }
                Some(9) => {
                    once(&mut seen, 512)?;
                    user = Some(j.string()?);
                }
                _ => return None,
            }
            if !j.more(b'}')? {
                break;
            }
        }
    }
    if !j.end() || seen & 2 == 0 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len().saturating_add(upstream_model.len() + 64));
    out.extend_from_slice(b"{\"model\":");
    push_escaped(&mut out, upstream_model);
    if let Some(s) = system {
        out.extend_from_slice(b",\"system\":");
        push_str(&mut out, s);
    }
    out.extend_from_slice(b",\"messages\":[");
    for (k, (role, content)) in turns.iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"role\":\"");
        out.extend_from_slice(role.as_bytes());
        out.extend_from_slice(b"\",\"content\":");
        push_str(&mut out, content);
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"max_tokens\":");
    let max = max_completion_tokens
        .or(max_tokens)
        .unwrap_or(u64::from(default_max_tokens).max(1));
    push_u64(&mut out, max);
    for (name, n) in [
        (&b",\"temperature\":"[..], temperature),
        (b",\"top_p\":", top_p),
    ] {
        if let Some(n) = n {
            out.extend_from_slice(name);
            let _ = serde_json::to_writer(&mut out, &n);
        }
    }
    if let Some(list) = stop {
        out.extend_from_slice(b",\"stop_sequences\":[");
        for (k, s) in list.iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            push_str(&mut out, s);
        }
        out.push(b']');
    }
    if let Some(s) = stream {
        out.extend_from_slice(if s {
            &b",\"stream\":true"[..]
        } else {
            b",\"stream\":false"
        });
    }
    if let Some(u) = user {
        out.extend_from_slice(b",\"metadata\":{\"user_id\":");
        push_str(&mut out, u);
        out.push(b'}');
    }
    out.push(b'}');
    Some(Translated {
        body: out,
        stream: stream.unwrap_or(false),
        include_usage,
    })
}

/// `messages`: plain text turns; the first `system` or `developer`
/// message is the system prompt; turns alternate (merging is the long
/// way's).
fn messages<'a>(
    j: &mut Json<'a>,
    system: &mut Option<&'a [u8]>,
    turns: &mut SmallVec<[(&'static str, &'a [u8]); 8]>,
) -> Option<()> {
    if !j.open(b'[', b']')? {
        return Some(());
    }
    loop {
        let (mut role, mut content) = (None, None);
        if j.open(b'{', b'}')? {
            loop {
                match j.member([b"role", b"content"])? {
                    Some(0) if role.is_none() => role = Some(j.string()?),
                    Some(1) if content.is_none() => content = Some(j.string()?),
                    _ => return None,
                }
                if !j.more(b'}')? {
                    break;
                }
            }
        }
        let (role, content) = (role?, content?);
        let role = match role {
            b"system" | b"developer" if system.is_none() => {
                *system = Some(content);
                None
            }
            b"user" => Some("user"),
            b"assistant" => Some("assistant"),
            _ => return None,
        };
        if let Some(role) = role {
            if turns.last().is_some_and(|(r, _)| *r == role) {
                return None;
            }
            turns.push((role, content));
        }
        if !j.more(b']')? {
            return Some(());
        }
    }
}

/// The answer of `super::fast::simple_response` for a message of text
/// (and thinking) blocks, and the usage it reports.
pub(super) fn response(body: &[u8], client_model: &str, created: u64) -> Option<(Vec<u8>, Usage)> {
    std::str::from_utf8(body).ok()?;
    let mut j = Json::new(body);
    let mut seen = 0u32;
    let mut id = None;
    let mut texts: SmallVec<[&[u8]; 4]> = SmallVec::new();
    let mut stop = None;
    let mut usage = Usage::default();
    if j.open(b'{', b'}')? {
        loop {
            let member = j.member([b"type", b"id", b"content", b"stop_reason", b"usage"])?;
            match member {
                Some(0) => {
                    once(&mut seen, 1)?;
                    if j.string()? != b"message" {
                        return None;
                    }
                }
                Some(1) => {
                    once(&mut seen, 2)?;
                    id = Some(j.string()?);
                }
                Some(2) => {
                    once(&mut seen, 4)?;
                    blocks(&mut j, &mut texts)?;
                }
                Some(3) => {
                    once(&mut seen, 8)?;
                    stop = Some(j.string()?);
                }
                Some(4) => {
                    once(&mut seen, 16)?;
                    usage.merge(&usage_in(&mut j)?);
                }
                _ => j.skip(1)?,
            }
            if !j.more(b'}')? {
                break;
            }
        }
    }
    if !j.end() || seen & 4 == 0 {
        return None;
    }
    let finish = finish_reason(std::str::from_utf8(stop?).ok()?).ok()?;
    let text_len: usize = texts.iter().map(|t| t.len()).sum();
    let mut out = Vec::with_capacity(text_len.saturating_add(client_model.len() + 320));
    out.extend_from_slice(b"{\"id\":");
    push_str(&mut out, id?);
    out.extend_from_slice(b",\"object\":\"chat.completion\",\"created\":");
    push_u64(&mut out, created);
    out.extend_from_slice(b",\"model\":");
    push_escaped(&mut out, client_model);
    out.extend_from_slice(
        b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"",
    );
    for t in &texts {
        out.extend_from_slice(t);
    }
    out.extend_from_slice(b"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":\"");
    out.extend_from_slice(finish.as_bytes());
    out.extend_from_slice(b"\"}],\"usage\":");
    push_usage(&mut out, &usage);
    out.push(b'}');
    Some((out, usage))
}

/// OpenAI's `usage` object for `usage` (what [`Usage::openai`] gives).
pub(super) fn push_usage(out: &mut Vec<u8>, usage: &Usage) {
    out.extend_from_slice(b"{\"prompt_tokens\":");
    let prompt = usage.prompt_tokens();
    push_u64(out, prompt);
    out.extend_from_slice(b",\"completion_tokens\":");
    push_u64(out, usage.output_tokens);
    out.extend_from_slice(b",\"total_tokens\":");
    push_u64(out, prompt.saturating_add(usage.output_tokens));
    if usage.cache_creation_input_tokens.is_some() || usage.cache_read_input_tokens.is_some() {
        out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        push_u64(out, usage.cache_read_input_tokens.unwrap_or(0));
        out.push(b'}');
    }
    out.push(b'}');
}

/// `content`: text blocks (their texts, in order) and thinking blocks
/// (left out); a tool call or any other block is the typed path's.
fn blocks<'a>(j: &mut Json<'a>, texts: &mut SmallVec<[&'a [u8]; 4]>) -> Option<()> {
    if !j.open(b'[', b']')? {
        return Some(());
    }
    loop {
        let (mut kind, mut text) = (None, None);
        if j.open(b'{', b'}')? {
            loop {
                match j.member([b"type", b"text", b"id", b"name", b"input"])? {
                    Some(0) if kind.is_none() => kind = Some(j.string()?),
                    Some(1) if text.is_none() => text = Some(j.string()?),
                    // A tool call's fields, or a field twice.
                    Some(_) => return None,
                    None => j.skip(2)?,
                }
                if !j.more(b'}')? {
                    break;
                }
            }
        }
        match kind? {
            b"text" => texts.push(text?),
            b"thinking" | b"redacted_thinking" => {}
            _ => return None,
        }
        if !j.more(b']')? {
            return Some(());
        }
    }
}

/// Anthropic's `usage` (counts or `null`; other fields skipped).
fn usage_in(j: &mut Json<'_>) -> Option<UsageIn> {
    let mut u = UsageIn::default();
    let mut seen = 0u32;
    if j.open(b'{', b'}')? {
        loop {
            let member = j.member([
                b"input_tokens",
                b"output_tokens",
                b"cache_creation_input_tokens",
                b"cache_read_input_tokens",
            ])?;
            match member {
                Some(0) => {
                    once(&mut seen, 1)?;
                    u.input_tokens = j.u64_or_null()?;
                }
                Some(1) => {
                    once(&mut seen, 2)?;
                    u.output_tokens = j.u64_or_null()?;
                }
                Some(2) => {
                    once(&mut seen, 4)?;
                    u.cache_creation_input_tokens = j.u64_or_null()?;
                }
                Some(3) => {
                    once(&mut seen, 8)?;
                    u.cache_read_input_tokens = j.u64_or_null()?;
                }
                _ => j.skip(2)?,
            }
            if !j.more(b'}')? {
                break;
            }
        }
    }
    Some(u)
}

/// A `content_block_delta` event's data when its delta is a
/// `text_delta`: the block's index and the text's raw bytes.
pub(super) fn text_delta(data: &[u8]) -> Option<(u64, &[u8])> {
    if let Some(found) = events::exact_text_delta(data) {
        return Some(found);
    }
    utf8(data).then_some(())?;
    let mut j = Json::new(data);
    let mut seen = 0u32;
    let (mut index, mut text) = (None, None);
    if j.open(b'{', b'}')? {
        loop {
            match j.key()? {
                b"index" => {
                    once(&mut seen, 1)?;
                    index = Some(j.u64()?);
                }
                b"delta" => {
                    once(&mut seen, 2)?;
                    let mut kind = None;
                    if j.open(b'{', b'}')? {
                        loop {
                            match j.key()? {
                                b"type" if kind.is_none() => kind = Some(j.string()?),
                                b"text" if text.is_none() => text = Some(j.string()?),
                                b"type" | b"text" => return None,
                                _ => j.skip(2)?,
                            }
                            if !j.more(b'}')? {
                                break;
                            }
                        }
                    }
                    if kind? != b"text_delta" {
                        return None;
                    }
                }
                _ => j.skip(1)?,
            }
            if !j.more(b'}')? {
                break;
            }
        }
    }
    if !j.end() {
        return None;
    }
    Some((index?, text?))
}
