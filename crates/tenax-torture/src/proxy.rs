//! A fault-injecting TCP proxy between the workers and the database.
//!
//! Modes: pass through; `latency` (each chunk delayed); `blackhole` (sockets stay open,
//! nothing is forwarded either way); `reset` (every open connection closed now); and
//! the one-shot `drop_commit_reply`: the next client chunk carrying a `COMMIT` (a
//! PostgreSQL simple query or a MySQL `COM_QUERY`) is forwarded, then the server's answer is thrown away and the
//! connection closed — the commit lands, the client cannot know (an ambiguous commit).
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How the proxy forwards right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Delay every chunk by this many milliseconds.
    Latency(u64),
    /// Forward nothing, close nothing.
    Blackhole,
}

#[derive(Debug)]
struct Shared {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped to close every open connection.
    generation: watch::Sender<u64>,
    arm_commit: AtomicBool,
    commits_cut: AtomicU64,
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listen on an ephemeral 127.0.0.1 port and forward to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            mode: watch::channel(Mode::Pass).0,
            generation: watch::channel(0).0,
            arm_commit: AtomicBool::new(false),
            commits_cut: AtomicU64::new(0),
        });
        let accept = shared.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = accept.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(shared.upstream).await {
                        connection(shared, client, server).await;
                    }
                });
            }
        });
        Ok(Self { addr, shared, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Change the forwarding mode.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// Close every open connection now.
    pub fn reset(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// Drop the reply to the next `COMMIT`, then close that connection.
    pub fn arm_drop_commit_reply(&self) {
        self.shared.arm_commit.store(true, Ordering::SeqCst);
    }

    /// Whether an armed `COMMIT` cut is still waiting for its commit.
    pub fn commit_cut_pending(&self) -> bool {
        self.shared.arm_commit.load(Ordering::SeqCst)
    }

    /// How many commit replies were dropped.
    pub fn commits_cut(&self) -> u64 {
        self.shared.commits_cut.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.reset();
    }
}

/// A client message whose text is `COMMIT`: a PostgreSQL simple query (`Q`, length,
/// text) or a MySQL `COM_QUERY` packet (3-byte length, sequence id, `0x03`, text).
fn is_commit(chunk: &[u8]) -> bool {
    let starts_commit = |text: &[u8]| text.len() >= 6 && text[..6].eq_ignore_ascii_case(b"COMMIT");
    let postgres = chunk.first() == Some(&b'Q') && chunk.get(5..).is_some_and(starts_commit);
    let mysql = chunk.get(4) == Some(&0x03) && chunk.get(5..).is_some_and(starts_commit);
    postgres || mysql
}

async fn connection(shared: Arc<Shared>, client: TcpStream, server: TcpStream) {
    let mut generation = shared.generation.subscribe();
    generation.mark_unchanged();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Set once this connection's commit was sent: its replies are dropped from then on.
    let cut = Arc::new(AtomicBool::new(false));
    let up = pump(shared.clone(), client_read, server_write, cut.clone(), true);
    let down = pump(
        shared.clone(),
        server_read,
        client_write,
        cut.clone(),
        false,
    );
    let cut_wait = async {
        loop {
            if cut.load(Ordering::SeqCst) {
                // Give the server time to apply the commit, then hang up on the client.
                tokio::time::sleep(Duration::from_millis(200)).await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = generation.changed() => {}
        _ = cut_wait => {}
    }
}

async fn pump(
    shared: Arc<Shared>,
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
    upstream: bool,
) {
    let mut mode = shared.mode.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        loop {
            let current = *mode.borrow_and_update();
            match current {
                Mode::Pass => break,
                Mode::Latency(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    break;
                }
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if cut.load(Ordering::SeqCst) {
            // After the cut commit nothing more is forwarded either way.
            continue;
        }
        if upstream
            && is_commit(chunk)
            && shared
                .arm_commit
                .compare_exchange(true, false, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            // Set before the commit leaves, so its reply can only be dropped.
            cut.store(true, Ordering::SeqCst);
            shared.commits_cut.fetch_add(1, Ordering::SeqCst);
        }
        if to.write_all(chunk).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_commit;

    #[test]
    fn commit_is_recognised_in_both_wire_protocols() {
        let mut pg = vec![b'Q', 0, 0, 0, 11];
        pg.extend_from_slice(b"COMMIT\0");
        assert!(is_commit(&pg));
        let mut mysql = vec![7, 0, 0, 0, 0x03];
        mysql.extend_from_slice(b"COMMIT");
        assert!(is_commit(&mysql));
        let mut other = vec![7, 0, 0, 0, 0x03];
        other.extend_from_slice(b"SELECT 1");
        assert!(!is_commit(&other));
        let mut prepared = vec![7, 0, 0, 0, 0x17];
        prepared.extend_from_slice(b"COMMIT");
        assert!(!is_commit(&prepared));
        assert!(!is_commit(b"Q"));
    }
}
