//! Swaps between the arena (device memory) and the host pool, on a copy thread that runs
//! beside the steps, as a GPU's copy engine runs beside its compute stream.
//!
//! One thread serves every run of every executable, first in first out: a run's swap step
//! hands it a copy and goes on; a later step that needs the copy done (the reader of a
//! swap-in's result, or the first step that writes over a swapped-out value's bytes) waits for
//! it ([`Executable`](super::Executable) computes those waits at compile time), and the run
//! waits for all of its copies before it returns. First in first out also orders the copies
//! among themselves: a swap-in starts after the swap-out that filled its host value, and a
//! swap-out's bytes are read before a later swap-in overwrites them.
//!
//! With a link bandwidth (`Cpu::link_bandwidth`), a copy of `n` bytes takes at least `n /
//! bandwidth` seconds (it sleeps for the rest): a PCIe link simulated honestly on a machine
//! without one.

use super::send_ptr::SendPtr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Checks of a copy's completion before a waiting step blocks (some tens of microseconds).
const SPINS: u32 = 20_000;

/// One copy for the copy thread.
struct Job {
    src: SendPtr<*const u8>,
    dst: SendPtr<*mut u8>,
    len: usize,
    /// Bytes per second, if the copy is throttled.
    bandwidth: Option<f64>,
    /// The run's completions, and this copy's ticket among them.
    done: Arc<Done>,
    ticket: u64,
}

/// The last ticket a run's copies have completed, and a way to wait for more: waiters spin on
/// `last` a little (a copy of a few hundred KiB is done in tens of microseconds, about what
/// waking a blocked thread costs), then block on `more` under `lock`.
#[derive(Default)]
struct Done {
    last: AtomicU64,
    lock: Mutex<()>,
    more: Condvar,
}

impl Done {
    /// Records that copies up to `ticket` are done and wakes the waiters.
    fn complete(&self, ticket: u64) {
        self.last.store(ticket, Ordering::Release);
        // Taken so that a waiter between its check and its wait cannot miss the notification.
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.more.notify_all();
    }
}

/// The copy thread's queue (started on first use).
fn queue() -> &'static Sender<Job> {
    static QUEUE: OnceLock<Sender<Job>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        std::thread::Builder::new()
            .name("tcc-copy".into())
            .spawn(move || {
                for job in rx {
                    let start = std::time::Instant::now();
                    // SAFETY: the run that issued the job keeps both buffers alive and leaves
                    // them alone until the job is done (it waits for its ticket before any
                    // step that writes them, and before it returns).
                    unsafe { std::ptr::copy_nonoverlapping(job.src.get(), job.dst.get(), job.len) };
                    if let Some(bw) = job.bandwidth {
                        let least = std::time::Duration::from_secs_f64(job.len as f64 / bw);
                        if let Some(rest) = least.checked_sub(start.elapsed()) {
                            std::thread::sleep(rest);
                        }
                    }
                    job.done.complete(job.ticket);
                }
            })
            .expect("the copy thread starts");
        tx
    })
}

/// One run's copies: issued in step order, each with a ticket, waited for by ticket.
pub(super) struct Copies {
    done: Arc<Done>,
    issued: u64,
    /// The ticket of each swap step issued, by step index.
    tickets: Vec<u64>,
    bandwidth: Option<f64>,
}

impl Copies {
    /// A run's copies, for an executable of `steps` steps.
    pub(super) fn new(steps: usize, bandwidth: Option<f64>) -> Copies {
        Copies {
            done: Arc::default(),
            issued: 0,
            tickets: vec![0; steps],
            bandwidth,
        }
    }

    /// Hands step `step`'s copy of `len` bytes from `src` to `dst` to the copy thread.
    ///
    /// # Safety
    /// `src` and `dst` hold `len` bytes and do not overlap; they stay alive, and nothing else
    /// writes `dst` or `src` (nor reads `dst`), until [`Copies::wait`] for this step (or
    /// [`Copies::finish`]) returns.
    pub(super) unsafe fn issue(&mut self, step: usize, src: *const u8, dst: *mut u8, len: usize) {
        self.issued += 1;
        self.tickets[step] = self.issued;
        let job = Job {
            // SAFETY: the caller's contract: only the copy thread touches these bytes meanwhile.
            src: unsafe { SendPtr::new(src) },
            dst: unsafe { SendPtr::new(dst) },
            len,
            bandwidth: self.bandwidth,
            done: self.done.clone(),
            ticket: self.issued,
        };
        if let Err(e) = queue().send(job) {
            // The copy thread is gone (it cannot panic short of a bug): copy here instead.
            let job = e.0;
            // SAFETY: as for the copy thread.
            unsafe { std::ptr::copy_nonoverlapping(job.src.get(), job.dst.get(), job.len) };
            job.done.complete(job.ticket);
        }
    }

    /// Waits until step `step`'s copy is done.
    pub(super) fn wait(&self, step: usize) {
        self.wait_for(self.tickets[step]);
    }

    /// Waits until every copy issued is done.
    pub(super) fn finish(&self) {
        self.wait_for(self.issued);
    }

    fn wait_for(&self, ticket: u64) {
        let done = || self.done.last.load(Ordering::Acquire) >= ticket;
        for _ in 0..SPINS {
            if done() {
                return;
            }
            std::hint::spin_loop();
        }
        let mut guard = self.done.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !done() {
            guard = (self.done.more.wait(guard)).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Copies {
    /// A run that stops early (an error in a step) still waits for its copies, which write
    /// into buffers it is about to free or reuse.
    fn drop(&mut self) {
        self.finish();
    }
}
