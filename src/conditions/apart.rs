//! Where evaluations that can take long run: not on the async workers, where one would stall
//! every other caller's calls (two such calls on a two-worker runtime stop the sidecar for as
//! long as they take). A condition that iterates over the call's data ([`Condition::may_take_long`])
//! is evaluated on a thread of its own, named `toolgate-conditions`, while the worker that asked
//! hands its other tasks to another ([`tokio::task::block_in_place`]); at most as many at once as
//! the machine has cores, the others waiting for a turn off the workers too. Everything else is
//! evaluated where it is asked, as it costs less than a thread would.
//!
//! [`Condition::may_take_long`]: super::Condition::may_take_long

use std::sync::{Condvar, Mutex, PoisonError};

use tokio::runtime::{Handle, RuntimeFlavor};

/// The thread an evaluation that can take long runs on.
pub const THREAD_NAME: &str = "toolgate-conditions";

/// Runs evaluations that can take long apart from the async workers, a bounded number at once.
#[derive(Debug)]
pub struct Apart {
    running: Mutex<usize>,
    finished: Condvar,
    most: usize,
}

impl Default for Apart {
    /// As many at once as the machine has cores.
    fn default() -> Self {
        Apart::new(std::thread::available_parallelism().map_or(1, usize::from))
    }
}

impl Apart {
    pub fn new(most: usize) -> Self {
        Apart {
            running: Mutex::new(0),
            finished: Condvar::new(),
            most: most.max(1),
        }
    }

    /// `evaluate`'s answer: where it is asked unless `long`; otherwise on a thread of its own,
    /// the asking worker's tasks handed to another meanwhile (on a current-thread runtime, or
    /// none, there is no other worker to hand them to).
    pub fn run<R: Send>(&self, long: bool, evaluate: impl FnOnce() -> R + Send) -> R {
        if !long {
            return evaluate();
        }
        let apart = || self.on_own_thread(evaluate);
        match Handle::try_current().map(|handle| handle.runtime_flavor()) {
            Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(apart),
            _ => apart(),
        }
    }

    fn on_own_thread<R: Send>(&self, evaluate: impl FnOnce() -> R + Send) -> R {
        let _turn = self.turn();
        let mut evaluate = Some(evaluate);
        let answered = std::thread::scope(|scope| {
            let spawned = std::thread::Builder::new()
                .name(THREAD_NAME.to_owned())
                .spawn_scoped(scope, || evaluate.take().map(|evaluate| evaluate()));
            match spawned {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                // No thread to be had (the process's limit): here, rather than not at all.
                Err(_) => None,
            }
        });
        match answered {
            Some(answer) => answer,
            None => match evaluate.take() {
                Some(evaluate) => evaluate(),
                // The thread took it: it answered, or unwound above.
                None => unreachable!("an evaluation taken by its thread answered"),
            },
        }
    }

    /// Waits for a turn among the [`Apart::most`] running at once; given back when dropped.
    fn turn(&self) -> Turn<'_> {
        let lock = |r: Result<_, PoisonError<_>>| r.unwrap_or_else(PoisonError::into_inner);
        let mut running = lock(self.running.lock());
        while *running >= self.most {
            running = lock(self.finished.wait(running));
        }
        *running += 1;
        Turn(self)
    }
}

struct Turn<'a>(&'a Apart);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut running = self
            .0
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *running -= 1;
        self.0.finished.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_may_take_long_runs_on_its_own_thread_and_the_rest_here() {
        let apart = Apart::new(1);
        let name = || std::thread::current().name().map(str::to_owned);
        let here = name();
        assert_eq!(apart.run(false, name), here);
        assert_eq!(apart.run(true, name).as_deref(), Some(THREAD_NAME));
        // On a multi-thread runtime too, borrowing what the caller holds.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let held = String::from("borrowed");
        let answer = runtime.block_on(async { apart.run(true, || (name(), held.len())) });
        assert_eq!(answer, (Some(THREAD_NAME.to_owned()), 8));
    }
}
