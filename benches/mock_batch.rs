//! Runs the project's loopback fake batch server (OpenAI Files + Batches, Anthropic
//! Message Batches) for benchmarks:
//!
//!     cargo bench --bench mock_batch -- --port 18300 --processing-ms 2000 &
//!
//! Options: --port P, --processing-ms M (how long a batch stays in_progress: the
//! provider's simulated processing time, to subtract from a client's wall time),
//! --seconds S (lifetime, default 900). It binds 127.0.0.1 only and stops by itself.

#[path = "../tests/support/batch_server.rs"]
mod batch_server;
#[path = "../tests/support/openai_server.rs"]
mod openai_server;

use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let num = |name: &str, default: f64| get(name).and_then(|v| v.parse::<f64>().ok()).unwrap_or(default);
    let port = num("--port", 18300.0) as u16;
    let lifetime = Duration::from_secs(num("--seconds", 900.0) as u64);
    let behaviour = batch_server::Behaviour {
        processing: Duration::from_millis(num("--processing-ms", 2000.0) as u64),
        lifetime,
        max_requests: u64::MAX,
        ..Default::default()
    };
    let server = batch_server::start_on(port, behaviour);
    eprintln!("fake batch server on {} for {lifetime:?}", server.base_url());
    std::thread::sleep(lifetime);
}
