//! The threads a step's parallel work runs on (a product's column tasks, attention's
//! heads): the calling thread and helpers that spin between jobs instead of sleeping.
//!
//! A single-stream decode step is ~130 small products (30–50 µs each) separated by a few
//! microseconds of glue. Through rayon, the second thread went to sleep between most of
//! them and had to be woken by a futex (a syscall on the caller, and tens of µs before
//! it started), so it took a smaller share and part of every product ran on one core.
//! Here the helpers poll for the next product for `SPIN` before they park; the caller
//! claims tasks too, so a product never waits for a helper to wake up.
//!
//! Attention runs here too rather than on rayon: with one team and one rayon pool, each a
//! thread per CPU, a helper still spinning after a product competed for a core with the
//! rayon worker running attention (a tenth of a 16-stream decode step went to the spin).
//!
//! Which thread runs a task changes nothing in its result: a task's output is computed
//! entirely by whichever thread claims it (see `cpu_matmul`'s batch-invariance contract).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Jobs with more tasks than this run on the caller alone (the index has 16 bits; a
/// product has a few tasks per thread).
const MAX_TASKS: usize = 0xffff;
/// How long an idle helper polls for the next job before it parks.
const SPIN: Duration = Duration::from_micros(300);

/// The task function of the running job, its lifetime erased (see `Team::run`).
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// `epoch << 32 | tasks << 16 | next task index`: the job's number and size
    /// travel with the index, so a helper claims a task of the job it saw with one
    /// compare-and-swap, and never one of a later job or past the end.
    next: AtomicU64,
    done: AtomicUsize,
    job: std::sync::Mutex<Option<SendJob>>,
    /// A task panicked; the caller panics in its place.
    panicked: AtomicBool,
    /// Per helper: parked (or about to), so the next job must unpark it.
    parked: Vec<AtomicBool>,
}

#[derive(Clone, Copy)]
struct SendJob(Job);
// SAFETY: the pointee is `Sync`, and `Team::run` keeps it alive until no helper can
// call it any more.
unsafe impl Send for SendJob {}

/// The calling thread plus helper threads.
pub(crate) struct Team {
    shared: Arc<Shared>,
    /// The helpers that started, each with its index in `Shared::parked`.
    helpers: Vec<(usize, Thread)>,
    busy: std::sync::Mutex<()>,
}

impl Team {
    /// The process's team: one helper per CPU beyond the caller's (rayon's thread count).
    pub fn global() -> &'static Team {
        static TEAM: OnceLock<Team> = OnceLock::new();
        TEAM.get_or_init(|| Team::new(rayon::current_num_threads().saturating_sub(1)))
    }

    fn new(helpers: usize) -> Team {
        let shared = Arc::new(Shared {
            next: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: std::sync::Mutex::new(None),
            panicked: AtomicBool::new(false),
            parked: (0..helpers).map(|_| AtomicBool::new(false)).collect(),
        });
        let mut started = Vec::new();
        for i in 0..helpers {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sonde-team-{}", i + 1))
                .spawn(move || helper(&s, i));
            match spawned {
                Ok(handle) => started.push((i, handle.thread().clone())),
                // Fewer helpers only means less parallelism; the caller claims every
                // task it has to.
                Err(e) => tracing::warn!("compute helper thread: {e}"),
            }
        }
        Team {
            shared,
            helpers: started,
            busy: std::sync::Mutex::new(()),
        }
    }

    /// The threads a job runs on: the caller and the helpers.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Runs `task(0) .. task(n - 1)`, each exactly once, on the caller and the helpers,
    /// and returns when all have finished. The team runs one job at a time: a caller
    /// that finds it busy (another engine in the same process, as in the tests) runs its
    /// tasks itself.
    pub fn run(&self, n: usize, task: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        let turn = self.busy.try_lock();
        if turn.is_err() || n > MAX_TASKS {
            (0..n).for_each(task);
            return;
        }
        // SAFETY (lifetime erasure): helpers dereference the pointer only after claiming
        // a task of this epoch, and this function returns only once every task of the
        // epoch has finished, so no call outlives `task`.
        let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(task) };
        *lock(&s.job) = Some(SendJob(job));
        s.done.store(0, Ordering::Relaxed);
        let epoch = ((s.next.load(Ordering::Relaxed) >> 32) + 1) & 0xffff_ffff;
        s.next
            .store(epoch << 32 | (n as u64) << 16, Ordering::SeqCst);
        for (i, thread) in &self.helpers {
            if s.parked[*i].load(Ordering::SeqCst) {
                thread.unpark();
            }
        }
        while let Some(t) = claim(s, epoch) {
            run_one(s, task, t);
        }
        while s.done.load(Ordering::Acquire) < n {
            std::hint::spin_loop();
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a task panicked on a helper thread");
        }
    }
}

/// Claims the next task of `epoch`, if it has one left.
fn claim(s: &Shared, epoch: u64) -> Option<usize> {
    let mut v = s.next.load(Ordering::Acquire);
    loop {
        let (index, n) = (v & 0xffff, (v >> 16) & 0xffff);
        if v >> 32 != epoch || index >= n {
            return None;
        }
        match s
            .next
            .compare_exchange_weak(v, v + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(index as usize),
            Err(now) => v = now,
        }
    }
}

fn run_one(s: &Shared, task: &(dyn Fn(usize) + Sync), t: usize) {
    if catch_unwind(AssertUnwindSafe(|| task(t))).is_err() {
        s.panicked.store(true, Ordering::Relaxed);
    }
    s.done.fetch_add(1, Ordering::Release);
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn helper(s: &Shared, i: usize) {
    let mut seen = 0u64;
    let mut idle_since = Instant::now();
    loop {
        let v = s.next.load(Ordering::Acquire);
        let epoch = v >> 32;
        if epoch != seen {
            seen = epoch;
            while let Some(t) = claim(s, epoch) {
                // Read after the claim: the job cannot change while a task of its
                // epoch is unfinished.
                let job = *lock(&s.job);
                match job {
                    // SAFETY: see `Team::run`.
                    Some(SendJob(job)) => run_one(s, unsafe { &*job }, t),
                    // Cannot happen (the job is set before its epoch is published); if it
                    // did, the caller panics instead of waiting forever.
                    None => run_one(s, &|_| panic!("a task without its job"), t),
                }
            }
            idle_since = Instant::now();
            continue;
        }
        if idle_since.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        s.parked[i].store(true, Ordering::SeqCst);
        if s.next.load(Ordering::SeqCst) >> 32 == seen {
            std::thread::park();
        }
        s.parked[i].store(false, Ordering::SeqCst);
        idle_since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every task runs exactly once, for products of every size, one after the other
    /// with and without pauses long enough for the helpers to park.
    #[test]
    fn each_task_runs_once() {
        let team = Team::new(2);
        for n in (0..200).chain([1000, 5000]) {
            let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            team.run(n, &|t| {
                counts[t].fetch_add(1, Ordering::Relaxed);
            });
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "{n}");
            if n % 50 == 0 {
                std::thread::sleep(SPIN * 3);
            }
        }
    }

    /// Callers on several threads at once: one has the team, the others run their own
    /// tasks; nobody loses or repeats one.
    #[test]
    fn concurrent_callers_each_get_all_their_tasks() {
        let team = Team::new(1);
        std::thread::scope(|scope| {
            for caller in 0..4 {
                let team = &team;
                scope.spawn(move || {
                    for round in 0..300 {
                        let n = 1 + (caller * 7 + round) % 40;
                        let sum = AtomicUsize::new(0);
                        team.run(n, &|t| {
                            sum.fetch_add(t + 1, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), n * (n + 1) / 2);
                    }
                });
            }
        });
    }

    /// A panicking task reaches the caller as a panic, not a hang.
    #[test]
    fn a_panicking_task_panics_the_caller() {
        let team = Team::new(1);
        let result = catch_unwind(AssertUnwindSafe(|| {
            team.run(64, &|t| {
                assert!(t != 37, "task 37");
            })
        }));
        assert!(result.is_err());
    }
}
