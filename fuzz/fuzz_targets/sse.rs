//! The SSE framer, event parse and skimmer (`src/dataplane/sse/`): never a
//! panic; the framer passes on exactly the bytes it was given, up to the
//! last event boundary; whenever the skimmer (alone or a stream's) reads
//! an event, the parse reads it the same way (a transcript fed either is
//! the same).
//!
//! Input: one control byte (a piece size), then an event stream.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use zonegate::dataplane::sse::{
    body_usage, events, events_usage, parse, skim, Event, Framer, Skim, Skimmer, Transcript,
};

/// Asserts that the parse reads `event` as the skimmer's `answer` says.
fn agrees(event: &[u8], answer: &Skim<'_>) {
    let shown = String::from_utf8_lossy(event);
    match answer {
        Skim::Text { text, finish } => {
            let parsed = parse(event);
            assert!(
                matches!(parsed, Event::Data(_)),
                "parsed otherwise: {shown:?}"
            );
            let mut a = Transcript::new();
            a.push(text, *finish);
            let mut b = Transcript::new();
            b.observe(&parsed);
            assert_eq!(
                (a.text, a.deltas, a.finished, a.plain, a.usage),
                (b.text, b.deltas, b.finished, b.plain, b.usage),
                "{shown:?}"
            );
        }
        Skim::Done => assert!(matches!(parse(event), Event::Done), "{shown:?}"),
        Skim::Unsure => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, stream)) = data.split_first() else {
        return;
    };
    let step = usize::from(ctl).max(1);
    let mut framer = Framer::default();
    let mut skimmer = Skimmer::default();
    let mut transcript = Transcript::new();
    let mut passed = Vec::new();
    for piece in stream.chunks(step) {
        let Ok(whole) = framer.push(Bytes::copy_from_slice(piece)) else {
            return;
        };
        passed.extend_from_slice(&whole);
        let _ = events_usage(&whole);
        let mut split = Vec::new();
        for event in events(&whole) {
            split.extend_from_slice(&event);
            agrees(&event, &skim(&event));
            agrees(&event, &skimmer.skim(&event));
            transcript.observe(&parse(&event));
        }
        assert_eq!(split, whole.as_ref(), "the events are the whole, cut");
    }
    assert!(
        stream.starts_with(&passed),
        "the framer passes on what it got"
    );
    let _ = (framer.has_partial(), body_usage(stream));
});
