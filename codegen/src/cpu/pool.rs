//! The threads kernels run on: a pool whose workers spin between the parallel steps of a run
//! instead of going to sleep.
//!
//! A model's run is dozens of parallel steps with short serial stretches between them. A
//! worker that sleeps in between (as rayon's do after a few dozen idle rounds) takes tens of
//! microseconds to wake: measured here, a parallel step of two 20 µs halves took 55 µs after
//! 50 µs of serial work. onnxruntime's and PyTorch's threads spin for the same reason. So while
//! a run is in progress ([`Run`]), and for a short grace period after the last one ends, idle
//! workers spin on the job slot; after that they park on a condition variable, and the next job
//! or run wakes them.
//!
//! [`for_each`]`(n, f)` runs `f(0)`..`f(n - 1)` on the calling thread and up to `threads() - 1`
//! workers, and returns when all are done. The items are cut into one contiguous share per
//! thread; each thread takes the items of its own share in order, then helps with what is
//! left of the others'. So consecutive steps whose items are ordered alike (images, then
//! rows) give a thread the same part of the data each time, which it wrote into its own
//! cache, while an early finisher still takes work from a late one.
//! One job is published at a time: a call made while another thread's job is out (two runs
//! of one executable at once), or from inside an item, runs its items on its own thread.
//! [`threads`] is the number of threads a parallel step may use: the limit [`with_threads`] set on
//! the calling thread, else the size of the rayon pool the caller is in (`tcc bench --threads`
//! installs one; outside any, one per core).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long workers keep spinning after the last run ended: back-to-back runs (a server, a
/// benchmark) find them awake.
const GRACE: Duration = Duration::from_millis(2);

/// The threads a parallel step may use: [`with_threads`]'s limit, else the caller's rayon pool's
/// size.
pub(crate) fn threads() -> usize {
    match LIMIT.with(Cell::get) {
        0 => rayon::current_num_threads().max(1),
        n => n,
    }
}

thread_local! {
    /// The limit [`with_threads`] set on this thread (0: none).
    static LIMIT: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f` on this thread with the parallel steps of the runs it makes on `n` threads in all
/// (this one and `n - 1` workers; at least one). Unlike installing a rayon pool of that size,
/// nothing moves to another thread, so a short run pays no hand-off.
pub fn with_threads<T>(n: usize, f: impl FnOnce() -> T) -> T {
    /// Restores the previous limit, also when `f` panics.
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            LIMIT.with(|l| l.set(self.0));
        }
    }
    let _restore = Restore(LIMIT.with(|l| l.replace(n.max(1))));
    f()
}

/// A seat's share of a job's items: the next one to take, and the end. On cache lines of its
/// own: the seats take items from their shares at the same time, and shares on one line moved
/// it between the cores at every item taken.
#[repr(align(128))]
struct Share(AtomicUsize, usize);

/// One parallel loop, published to the workers.
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
    /// Seat `t`'s share of the items.
    shares: Vec<Share>,
    /// Workers that may still join (the caller's thread count less one).
    seats: AtomicUsize,
    /// Whether an item panicked on a worker.
    panicked: AtomicBool,
}

impl Job<'_> {
    /// Items `0..n` in `threads` contiguous shares.
    fn shares(n: usize, threads: usize) -> Vec<Share> {
        (0..threads)
            .map(|t| Share(AtomicUsize::new(t * n / threads), (t + 1) * n / threads))
            .collect()
    }

    /// Takes and runs items until none are left: first seat `seat`'s share in order, then
    /// what is left of the others'.
    fn work(&self, seat: usize) {
        let k = self.shares.len();
        for t in (seat..k).chain(0..seat) {
            let Share(next, end) = &self.shares[t];
            loop {
                let i = next.fetch_add(1, SeqCst);
                if i >= *end {
                    break;
                }
                (self.f)(i);
            }
        }
    }
}

struct Shared {
    /// The job out, or null.
    job: AtomicPtr<Job<'static>>,
    /// Bumped for every job published.
    epoch: AtomicU64,
    /// Workers between joining a job and leaving it: the caller waits for none before the job
    /// (on its stack) goes away.
    entered: AtomicUsize,
    /// Runs in progress, and when the last one ended (nanoseconds since `start`).
    runs: AtomicUsize,
    last_run: AtomicU64,
    start: Instant,
    /// Parked workers and what wakes them.
    parked: Mutex<usize>,
    wake: Condvar,
    /// Held while a job is out.
    publish: Mutex<()>,
    /// Workers started.
    workers: Mutex<usize>,
}

impl Shared {
    /// Whether idle workers should spin rather than park: a run is in progress or one ended
    /// within the grace period.
    fn spinning(&self) -> bool {
        self.runs.load(SeqCst) > 0 || {
            let since = self.start.elapsed().as_nanos() as u64;
            since.saturating_sub(self.last_run.load(SeqCst)) < GRACE.as_nanos() as u64
        }
    }

    fn wake_all(&self) {
        let parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if *parked > 0 {
            self.wake.notify_all();
        }
    }
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        job: AtomicPtr::new(std::ptr::null_mut()),
        epoch: AtomicU64::new(0),
        entered: AtomicUsize::new(0),
        runs: AtomicUsize::new(0),
        last_run: AtomicU64::new(0),
        start: Instant::now(),
        parked: Mutex::new(0),
        wake: Condvar::new(),
        publish: Mutex::new(()),
        workers: Mutex::new(0),
    })
}

thread_local! {
    /// Whether this thread is running a job's items (a worker, or a caller inside `for_each`):
    /// a nested `for_each` then runs on this thread alone.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Starts workers until there are at least `n`.
fn ensure_workers(s: &'static Shared, n: usize) {
    let mut started = s.workers.lock().unwrap_or_else(|e| e.into_inner());
    while *started < n {
        let spawned = std::thread::Builder::new()
            .name(format!("tcc-worker-{}", *started))
            .spawn(move || worker(s));
        if spawned.is_err() {
            // No more threads: the jobs run with those there are.
            return;
        }
        *started += 1;
    }
}

fn worker(s: &'static Shared) {
    BUSY.with(|b| b.set(true));
    let mut seen = s.epoch.load(SeqCst);
    loop {
        // Wait for a new job: spin while runs need us, park otherwise.
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(SeqCst);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(1024) || s.spinning() {
                std::hint::spin_loop();
                continue;
            }
            let mut parked = s.parked.lock().unwrap_or_else(|e| e.into_inner());
            *parked += 1;
            while s.epoch.load(SeqCst) == seen && !s.spinning() {
                parked = s.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
            }
            *parked -= 1;
        }
        s.entered.fetch_add(1, SeqCst);
        let p = s.job.load(SeqCst);
        if !p.is_null() && s.epoch.load(SeqCst) == seen {
            // SAFETY: the job stays alive until `entered` drops to zero (see `for_each`).
            let job = unsafe { &*p };
            // A seat, if one is left (never below zero, so later workers see none either).
            let seated = (job.seats).fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
            // The seats left before this one took its own: threads - 1 down to 1 (the caller
            // has seat 0).
            if let Ok(seat) = seated {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.work(seat)));
                if r.is_err() {
                    job.panicked.store(true, SeqCst);
                }
            }
        }
        s.entered.fetch_sub(1, SeqCst);
    }
}

/// Runs `f(i)` for every `i` in `0..n` on this thread and the pool's workers (see the module
/// docs); returns once all have run.
pub(crate) fn for_each(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let threads = threads().min(n);
    let inline = threads <= 1 || BUSY.with(|b| b.get());
    let s = shared();
    let guard = if inline {
        None
    } else {
        match s.publish.try_lock() {
            Ok(g) => Some(g),
            // A kernel panicked while holding it (a bug, reported where it happened): the
            // lock guards no data, so it is still good.
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    };
    if guard.is_none() {
        (0..n).for_each(f);
        return;
    }
    ensure_workers(s, threads - 1);
    let job = Job {
        f,
        shares: Job::shares(n, threads),
        seats: AtomicUsize::new(threads - 1),
        panicked: AtomicBool::new(false),
    };
    /// Withdraws the job and waits for the workers to leave it, also when an item panics on
    /// this thread.
    struct Withdraw<'a>(&'a Shared);
    impl Drop for Withdraw<'_> {
        fn drop(&mut self) {
            self.0.job.store(std::ptr::null_mut(), SeqCst);
            while self.0.entered.load(SeqCst) > 0 {
                std::hint::spin_loop();
            }
            BUSY.with(|b| b.set(false));
        }
    }
    // SAFETY (of the lifetime erasure): `Withdraw` unpublishes the job and waits until no
    // worker is inside it before `job` goes out of scope.
    let p = &job as *const Job as *mut Job<'static>;
    s.job.store(p, SeqCst);
    s.epoch.fetch_add(1, SeqCst);
    s.wake_all();
    {
        let _withdraw = Withdraw(s);
        BUSY.with(|b| b.set(true));
        job.work(0);
    }
    drop(guard);
    assert!(
        !job.panicked.load(SeqCst),
        "internal error: a kernel panicked on a worker thread"
    );
}

/// A run in progress: while one exists, idle workers spin instead of parking.
pub(crate) struct Run(());

impl Run {
    pub(crate) fn start() -> Run {
        let s = shared();
        if s.runs.fetch_add(1, SeqCst) == 0 {
            s.wake_all();
        }
        Run(())
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let s = shared();
        s.last_run
            .store(s.start.elapsed().as_nanos() as u64, SeqCst);
        s.runs.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::for_each;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// A job takes no more threads than its caller's pool has, even when more workers were
    /// started for an earlier, wider job.
    #[test]
    fn a_job_takes_at_most_its_threads() {
        let wide = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        wide.install(|| {
            for_each(8, &|_| {
                std::thread::sleep(std::time::Duration::from_millis(2))
            })
        });
        let narrow = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let ids = std::sync::Mutex::new(std::collections::HashSet::new());
        narrow.install(|| {
            for_each(40, &|_| {
                ids.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_millis(1));
            })
        });
        let n = ids.lock().unwrap().len();
        assert!(n <= 2, "{n} threads ran a job for two");
    }

    /// A worker starts with its own share (the second half, of two threads), not with the
    /// item after the caller's first: the caller's first item waits until another has started,
    /// so nothing but the worker's share rule decides which item that is.
    #[test]
    fn a_worker_starts_with_its_own_share() {
        let pair = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        // Another test's job may be out (then this one runs inline, on the caller): retry.
        for _ in 0..50 {
            let started = AtomicUsize::new(0);
            let firsts = std::sync::Mutex::new(std::collections::HashMap::new());
            // `install` runs the closure on one of the pair's threads: that is the caller.
            let caller = pair.install(|| {
                let caller = std::thread::current().id();
                for_each(8, &|i| {
                    let me = std::thread::current().id();
                    firsts.lock().unwrap().entry(me).or_insert(i);
                    if me != caller {
                        started.fetch_add(1, SeqCst);
                    } else if i == 0 {
                        let t = std::time::Instant::now();
                        while started.load(SeqCst) == 0 && t.elapsed().as_secs() < 1 {
                            std::hint::spin_loop();
                        }
                    }
                });
                caller
            });
            let firsts = firsts.into_inner().unwrap();
            if let Some((_, &first)) = firsts.iter().find(|(id, _)| **id != caller) {
                assert_eq!(first, 4, "a worker's first item: {firsts:?}");
                return;
            }
        }
        panic!("no worker joined a two-thread job in 50 tries");
    }

    /// `with_threads` limits the threads of the jobs started inside it, on this thread only,
    /// and restores the limit after.
    #[test]
    fn with_threads_limits_the_jobs_inside_it() {
        let ids = |n_items| {
            let ids = std::sync::Mutex::new(std::collections::HashSet::new());
            for_each(n_items, &|_| {
                ids.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(std::time::Duration::from_millis(1));
            });
            ids.into_inner().unwrap().len()
        };
        let outside = super::threads();
        assert_eq!(
            super::with_threads(1, || (super::threads(), ids(16))),
            (1, 1)
        );
        assert_eq!(super::with_threads(0, super::threads), 1);
        assert_eq!(super::with_threads(3, super::threads), 3);
        assert_eq!(super::threads(), outside);
        assert_eq!(
            std::thread::spawn(|| super::with_threads(5, super::threads))
                .join()
                .unwrap(),
            5
        );
    }

    #[test]
    fn every_item_runs_once_also_nested_and_from_several_threads() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            std::thread::scope(|t| {
                for _ in 0..3 {
                    t.spawn(|| {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(3)
                            .build()
                            .unwrap();
                        pool.install(|| {
                            for n in [0, 1, 2, 7, 100] {
                                let hits: Vec<AtomicUsize> =
                                    (0..n * 5).map(|_| AtomicUsize::new(0)).collect();
                                for_each(n, &|i| {
                                    for_each(5, &|j| {
                                        hits[i * 5 + j].fetch_add(1, SeqCst);
                                    })
                                });
                                assert!(hits.iter().all(|h| h.load(SeqCst) == 1));
                            }
                        })
                    });
                }
            });
        });
    }
}
