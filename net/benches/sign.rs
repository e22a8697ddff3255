//! The cost of signing a Raft call and of checking it on arrival (MAC,
//! freshness, the replay window), for an empty call (a heartbeat-sized
//! vote) and a 64 KiB append.
//!
//! ```sh
//! cargo bench -p zonegate-net --bench sign
//! ```

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use zonegate_net::sign::{self, Call, KeyRing, Purpose, Verifier};

fn bench(c: &mut Criterion) {
    let ring = KeyRing::derive("bench-cluster-secret-0123", Purpose::Raft).expect("a key");
    let call = Call {
        method: "POST",
        path: "/raft/v1/append",
        node: 2,
    };
    for (name, body) in [("empty", Vec::new()), ("64KiB", vec![7u8; 64 * 1024])] {
        c.bench_function(&format!("sign_call/{name}"), |b| {
            b.iter(|| black_box(sign::sign_call(&ring, call, black_box(&body), 1_000)))
        });
        let verifier = Verifier::new(ring.clone());
        let mut now = 1_000_000u64;
        c.bench_function(&format!("verify_call/{name}"), |b| {
            b.iter_batched(
                || {
                    now += 1;
                    (sign::sign_call(&ring, call, &body, now).header(), now)
                },
                |(header, now)| {
                    let s = verifier
                        .check_head(Some(&header), call, now)
                        .expect("valid");
                    sign::check_body(&s, black_box(&body)).expect("matches");
                },
                BatchSize::SmallInput,
            )
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
