//! How fast the drill's load generator sends: the suite checks a modest
//! floor that a busy 2-core machine meets; the figure in chaos/README.md
//! comes from the bench:
//!
//! ```sh
//! cargo bench -p zonegate-chaos --bench load_rate
//! ```

#[path = "common/tiny.rs"]
mod tiny;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generator_keeps_a_drill_rate_without_dropping() {
    let (rate, sent, not_sent) = tiny::measure(300.0, 3).await;
    eprintln!("300 req/s wanted: {rate:.0} ok/s, {sent} sent, {not_sent} not sent");
    assert_eq!(not_sent, 0);
    assert!(rate >= 250.0, "{rate}");
}
