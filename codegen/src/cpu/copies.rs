//! Swaps between the arena (device memory) and the host pool, on a copy thread that runs
//! beside the steps, as a GPU's copy engine runs beside its compute stream, or inline where no
//! core is left for that thread ([`Copying`](super::Copying)).
//!
//! One thread serves every run of every executable, first in first out: a run's swap step
//! hands it a copy and goes on; a later step that needs the copy done (the reader of a
//! swap-in's result, or the first step that writes over a swapped-out value's bytes) waits for
//! it ([`Executable`](super::Executable) computes those waits at compile time), and the run
//! waits for all of its copies before it returns. First in first out also orders the copies
//! among themselves: a swap-in starts after the swap-out that filled its host value, and a
//! swap-out's bytes are read before a later swap-in overwrites them.
//!
//! With a link bandwidth (`Cpu::link_bandwidth`), the run keeps a link clock: a copy occupies
//! the link for `n / bandwidth` seconds from when it is handed over or the link is free,
//! whichever is later, and a step that waits for it waits until then, even though the bytes
//! arrived sooner: a PCIe link simulated honestly on a machine without one. The copy thread
//! itself sleeps out a copy's link time only when that is over a millisecond (sleeping a few
//! microseconds costs tens on Linux, which turned a 4-microsecond copy into a 60-microsecond
//! one and stalled the readers); then the bytes really arrive late, which the tests of slow
//! links rely on to exercise the waits.

use super::send_ptr::SendPtr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

/// Checks of a copy's completion before a waiting step blocks (some tens of microseconds).
const SPINS: u32 = 20_000;

/// One copy for the copy thread.
struct Job {
    src: SendPtr<*const u8>,
    dst: SendPtr<*mut u8>,
    len: usize,
    /// The copy's time on the link, where the copy thread sleeps it out.
    hold: Option<std::time::Duration>,
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

/// A run's simulated link: when it is next free, and when each copy (by ticket) has crossed
/// it, in nanoseconds from `start`.
struct Link {
    bandwidth: f64,
    start: Instant,
    free: u64,
    ready: Vec<u64>,
}

impl Link {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Books a copy of `len` bytes handed over now, recording when it will have crossed;
    /// returns its time on the link.
    fn book(&mut self, len: usize) -> std::time::Duration {
        let secs = len as f64 / self.bandwidth;
        let begin = self.free.max(self.now());
        self.free = begin + (secs * 1e9) as u64;
        self.ready.push(self.free);
        std::time::Duration::from_secs_f64(secs)
    }

    /// Waits until the copy with `ticket` has crossed: sleeping while far off (less the
    /// timer's slack), spinning for the last stretch.
    fn wait(&self, ticket: u64) {
        let until = self.ready[ticket as usize];
        loop {
            let now = self.now();
            if now >= until {
                return;
            }
            let left = until - now;
            if left > 200_000 {
                std::thread::sleep(std::time::Duration::from_nanos(left - 100_000));
            } else {
                std::hint::spin_loop();
            }
        }
    }
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
                    let start = Instant::now();
                    // SAFETY: the run that issued the job keeps both buffers alive and leaves
                    // them alone until the job is done (it waits for its ticket before any
                    // step that writes them, and before it returns).
                    unsafe { std::ptr::copy_nonoverlapping(job.src.get(), job.dst.get(), job.len) };
                    if let Some(rest) = job.hold.and_then(|h| h.checked_sub(start.elapsed())) {
                        std::thread::sleep(rest);
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
    /// The simulated link, with a bandwidth.
    link: Option<Link>,
    /// Copies made by the issuing thread, not the copy thread.
    inline: bool,
}

impl Copies {
    /// A run's copies, for an executable of `steps` steps; `inline`: made by the thread that
    /// issues them.
    pub(super) fn new(steps: usize, bandwidth: Option<f64>, inline: bool) -> Copies {
        Copies {
            done: Arc::default(),
            issued: 0,
            tickets: vec![0; steps],
            link: bandwidth.map(|bandwidth| Link {
                bandwidth,
                start: Instant::now(),
                free: 0,
                ready: vec![0],
            }),
            inline,
        }
    }

    /// Hands step `step`'s copy of `len` bytes from `src` to `dst` to the copy thread, or
    /// makes it here when the copies are inline.
    ///
    /// # Safety
    /// `src` and `dst` hold `len` bytes and do not overlap; they stay alive, and nothing else
    /// writes `dst` or `src` (nor reads `dst`), until [`Copies::wait`] for this step (or
    /// [`Copies::finish`]) returns.
    pub(super) unsafe fn issue(&mut self, step: usize, src: *const u8, dst: *mut u8, len: usize) {
        self.issued += 1;
        self.tickets[step] = self.issued;
        // The copy thread sleeps out only long link times (see the module docs).
        let hold = (self.link.as_mut())
            .map(|link| link.book(len))
            .filter(|t| t.as_secs_f64() > 1e-3);
        if self.inline {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
            self.done.last.store(self.issued, Ordering::Release);
            return;
        }
        let job = Job {
            // SAFETY: the caller's contract: only the copy thread touches these bytes meanwhile.
            src: unsafe { SendPtr::new(src) },
            dst: unsafe { SendPtr::new(dst) },
            len,
            hold,
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
        if let Some(link) = &self.link {
            link.wait(ticket);
        }
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
