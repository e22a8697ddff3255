//! The drill's load generator at 5,000 short requests per second for 10 s
//! against a server that answers at once: what it reaches, and how many
//! requests it could not send on time. A measurement, not a test.
//!
//! ```sh
//! cargo bench -p zonegate-chaos --bench load_rate
//! ```

#[path = "../tests/common/tiny.rs"]
mod tiny;

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("load_rate: cannot start a runtime: {e}");
            std::process::exit(2);
        }
    };
    let (rate, sent, not_sent) = runtime.block_on(tiny::measure(5_000.0, 10));
    println!("load generator, 5000 req/s wanted for 10 s: {rate:.0} ok/s, {sent} sent, {not_sent} not sent");
}
