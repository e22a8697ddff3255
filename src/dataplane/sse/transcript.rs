//! What the client has been given of one answer ([`Transcript`]): its
//! text so far (bounded), and what a continuation must keep.

use super::*;
use crate::provider::Notes;

/// The most answer text a transcript keeps for a continuation; a longer
/// answer is no longer continuable (its text is let go), so a backend that
/// streams without end cannot grow a node's memory through the relay.
pub const MAX_TRANSCRIPT_BYTES: usize = 4 * 1024 * 1024;

/// What the client has been given of one answer.
#[derive(Debug, Default, Clone)]
pub struct Transcript {
    /// The answer's text so far.
    pub text: String,
    /// The first chunk's `id`, `model` and `created`: a continuation keeps
    /// them, so the client sees one completion.
    pub id: Option<String>,
    pub model: Option<String>,
    pub created: Option<u64>,
    /// Events that carried text (about one token each on vLLM, TGI and
    /// SGLang): the delivered part's token count for `usage`.
    pub deltas: u64,
    /// A `finish_reason` or `[DONE]` was delivered: the answer is whole.
    pub finished: bool,
    /// Only plain text so far: a continuation can re-create the rest.
    pub plain: bool,
    /// The answer's `usage`, when a chunk carried one (both parts of a
    /// continued answer counted).
    pub usage: Option<Usage>,
}

impl Transcript {
    /// Notes a skimmed text chunk that was delivered to the client.
    pub fn push(&mut self, text: &str, finish: bool) {
        self.append(text);
        self.finished |= finish;
    }

    /// Adds delivered text; past [`MAX_TRANSCRIPT_BYTES`] the answer stops
    /// being continuable and its text is dropped.
    pub(super) fn append(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.deltas += 1;
        self.keep(text);
    }

    /// Keeps delivered text while the answer is continuable.
    fn keep(&mut self, text: &str) {
        if !self.plain {
            return;
        }
        if self.text.len() + text.len() > MAX_TRANSCRIPT_BYTES {
            self.plain = false;
            self.text = String::new();
            return;
        }
        self.text.push_str(text);
    }

    pub fn new() -> Self {
        Self {
            plain: true,
            ..Self::default()
        }
    }

    /// Notes chunks a translation wrote and the client was given, from
    /// what the translation says they say ([`Notes`], `whole`): what
    /// [`Transcript::observe`] finds reading them. The identity is taken
    /// from the notes (they are cleared after).
    pub fn note(&mut self, notes: &mut Notes) {
        if self.id.is_none() {
            if let Some((id, model, created)) = notes.identity.take() {
                self.id = Some(id);
                self.model = Some(model);
                self.created = Some(created);
            }
        }
        // The joined text kept at once ends (or keeps) the transcript as
        // its parts kept one by one would: past the limit, no text is kept.
        self.deltas += notes.deltas;
        self.keep(&notes.text);
        self.finished |= notes.finished;
        if let Some((prompt_tokens, completion_tokens)) = notes.usage {
            self.usage = Some(Usage {
                prompt_tokens,
                completion_tokens,
            });
        }
    }

    /// Notes an event that was delivered to the client.
    pub fn observe(&mut self, event: &Event<'_>) {
        match event {
            Event::Done => self.finished = true,
            Event::Data(chunk) => {
                if chunk.usage.is_some() {
                    self.usage = chunk.usage;
                }
                if self.id.is_none() {
                    self.id = chunk.id.as_deref().map(str::to_owned);
                    self.model = chunk.model.as_deref().map(str::to_owned);
                    self.created = chunk.created;
                }
                for choice in &chunk.choices {
                    self.plain &= !choice.beyond_text();
                    if let Some(text) = choice.content() {
                        self.append(text);
                    }
                    self.finished |= choice.finish_reason.is_some();
                }
            }
            Event::Error | Event::Malformed | Event::Other => {}
        }
    }
}
