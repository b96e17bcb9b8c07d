//! Runs the project's loopback OpenAI-compatible test server for benchmarks:
//!
//!     cargo bench --bench mock_openai -- --port 18080 --latency-ms 200 --rpm 3000 &
//!     target/release/synth bench llm --base-url http://127.0.0.1:18080/v1 --model m --requests 2000 --rpm 3000
//!
//! Options: --port P, --latency-ms L, --rpm R (server-side limit, answered with 429 +
//! Retry-After; with --window-s W a strict sliding window: at most R * W / 60 requests in
//! any W seconds), --advertise (with --rpm: x-ratelimit-* headers on every answer and an exact
//! retry-after-ms), --p-500 X, --p-429 X, --p-malformed X, --seconds S (lifetime, default 900).
//! It binds 127.0.0.1 only and stops by itself after its lifetime, printing what it served
//! (with --window-s: the most requests it accepted in one window).

#[path = "../tests/support/openai_server.rs"]
mod openai_server;

use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes --bench; ignore flags we do not know.
    let get = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let num = |name: &str, default: f64| get(name).and_then(|v| v.parse::<f64>().ok()).unwrap_or(default);
    let port = num("--port", 18080.0) as u16;
    let behaviour = openai_server::Behaviour {
        latency: Duration::from_millis(num("--latency-ms", 0.0) as u64),
        rpm: get("--rpm").and_then(|v| v.parse().ok()),
        strict_window: get("--window-s").and_then(|v| v.parse::<f64>().ok()).map(Duration::from_secs_f64),
        advertise_limits: args.iter().any(|a| a == "--advertise"),
        p_500: num("--p-500", 0.0),
        p_429: num("--p-429", 0.0),
        p_malformed: num("--p-malformed", 0.0),
        lifetime: Duration::from_secs(num("--seconds", 900.0) as u64),
        ..Default::default()
    };
    let lifetime = behaviour.lifetime;
    let server = openai_server::start_on(port, behaviour);
    eprintln!("mock OpenAI server on {} for {:?}", server.base_url(), lifetime);
    std::thread::sleep(lifetime);
    let c = &server.counters;
    use std::sync::atomic::Ordering::Relaxed;
    eprintln!(
        "served {} requests: {} ok, {} 429, fullest window {}",
        c.total.load(Relaxed),
        c.ok.load(Relaxed),
        c.s429.load(Relaxed),
        c.max_in_window.load(Relaxed)
    );
}
