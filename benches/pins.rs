//! Memory of the session pin table (`dataplane::affinity::PinTable`):
//! 10³ to 10⁶ pinned sessions, each size in a fresh process, RSS before
//! and after the pins are made (issue 48's target: 10⁶ pins ≤ 200 MB).
//! Sessions are spread over three zones; the table's capacity is the
//! count, so nothing is shed.
//!
//! ```sh
//! cargo bench --bench pins
//! ```

use std::process::Command;
use std::time::Duration;

use zonegate::dataplane::affinity::PinTable;
use zonegate_cluster::ZoneId;

const CHILD: &str = "ZONEGATE_PINS_BENCH_COUNT";

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One size, in this process: prints "COUNT BYTES".
fn child(count: u64) {
    let zones = [
        ZoneId::new("az-a"),
        ZoneId::new("az-b"),
        ZoneId::new("az-c"),
    ];
    let before = rss_kib();
    let table = PinTable::new(count as usize, Duration::from_secs(3600));
    for i in 0..count {
        // Session keys are hashes: spread them like one.
        let session = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        table.put(session, zones[(i % 3) as usize].clone(), 1_000);
    }
    let after = rss_kib();
    assert_eq!(table.len() as u64, count);
    println!("{count} {}", after.saturating_sub(before) * 1024);
}

fn main() {
    if let Some(count) = std::env::var(CHILD).ok().and_then(|c| c.parse().ok()) {
        return child(count);
    }
    let exe = std::env::current_exe().expect("own path");
    println!("{:>10} {:>12} {:>10}", "pins", "RSS growth", "per pin");
    for count in [1_000u64, 10_000, 100_000, 1_000_000] {
        let out = Command::new(&exe)
            .env(CHILD, count.to_string())
            .output()
            .expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let bytes: u64 = text
            .split_whitespace()
            .nth(1)
            .and_then(|b| b.parse().ok())
            .unwrap_or(0);
        println!(
            "{count:>10} {:>9.1} MB {:>8} B",
            bytes as f64 / 1e6,
            bytes / count
        );
    }
}
