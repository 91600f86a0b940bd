//! Tasks with an owner. Every task the sidecar starts belongs to a [`Tasks`] group — a
//! cancellation token and a task tracker — that spawns it inside its span, tells it to stop
//! through the token, and waits for it. Nothing is aborted from outside: a task stops at its next
//! await once its group is cancelled (the group races every task against the token, so a loop
//! cannot forget its stop branch), and one that must finish something first (a writer flushing
//! its queue, a server closing its connections gracefully) takes the token itself.
//!
//! Shutdown (`app::Running::shutdown`) stops the groups one after another, in the order it
//! reads; dropping the owner of a group without shutting down cancels it too.

use std::{future::Future, time::Duration};

use tokio_util::{
    sync::{CancellationToken, DropGuard},
    task::{TaskTracker, task_tracker::TaskTrackerToken},
};
use tracing::Instrument;

/// A group of tasks stopped together. Cloning shares the group.
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl Tasks {
    pub fn new() -> Self {
        Tasks::default()
    }

    /// A group of its own that is also stopped when this one is (it can be stopped first).
    pub fn child(&self) -> Tasks {
        Tasks {
            stop: self.stop.child_token(),
            tracker: TaskTracker::new(),
        }
    }

    /// Spawns `task` in its own span (`task = name`); it is dropped at its next await once the
    /// group is stopped.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let stop = self.stop.clone();
        self.spawn_until_stopped(name, move |_| async move {
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = task => {}
            }
        });
    }

    /// Spawns the task `make` builds from the group's token, for a task that must finish
    /// something of its own once told to stop: it watches the token and ends by itself.
    pub fn spawn_until_stopped<F>(
        &self,
        name: &'static str,
        make: impl FnOnce(CancellationToken) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let task = make(self.stop.clone());
        self.tracker
            .spawn(task.instrument(tracing::info_span!("task", task = name)));
    }

    /// Whether the group was told to stop.
    pub fn is_cancelled(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// The group's stop signal, for work that is not a task of its own (a graceful-shutdown
    /// future handed to a server).
    pub fn token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Counts `work` as running in this group until the returned token is dropped; for work that
    /// lives in someone else's task (a call served by the transport).
    pub fn count(&self) -> TaskTrackerToken {
        self.tracker.token()
    }

    /// Tasks (and counted work) not finished yet.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }

    /// Stops the group when the returned guard is dropped: for the owner of a group that may be
    /// dropped without shutting down.
    pub fn stop_on_drop(&self) -> DropGuard {
        self.stop.clone().drop_guard()
    }

    /// Tells every task to stop, without waiting.
    pub fn cancel(&self) {
        self.stop.cancel();
    }

    /// Waits until everything counted in the group has finished, without telling it to stop.
    pub async fn finished(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Tells every task to stop and waits for them, up to `within`; whether they all ended.
    pub async fn stop(&self, within: Duration) -> bool {
        self.cancel();
        tokio::time::timeout(within, self.finished()).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stopping_a_group_ends_its_loops_and_waits_for_them() {
        let tasks = Tasks::new();
        let (ticks, mut ticked) = tokio::sync::mpsc::channel::<()>(1);
        tasks.spawn("forever", async move {
            loop {
                let _ = ticks.send(()).await;
                tokio::task::yield_now().await;
            }
        });
        ticked.recv().await.expect("the loop runs");
        assert_eq!(tasks.running(), 1);
        assert!(tasks.stop(Duration::from_secs(5)).await, "the loop stopped");
        assert_eq!(tasks.running(), 0);
    }

    #[tokio::test]
    async fn a_task_that_watches_the_token_finishes_its_work_first() {
        let tasks = Tasks::new();
        let (done, finished) = tokio::sync::oneshot::channel();
        tasks.spawn_until_stopped("writer", |stop| async move {
            stop.cancelled().await;
            let _ = done.send("flushed");
        });
        assert!(tasks.stop(Duration::from_secs(5)).await);
        assert_eq!(finished.await.ok(), Some("flushed"));
    }

    #[tokio::test]
    async fn counted_work_holds_the_group_until_it_is_dropped() {
        let tasks = Tasks::new();
        let work = tasks.count();
        assert!(
            !tasks.stop(Duration::from_millis(20)).await,
            "work still counted"
        );
        drop(work);
        assert!(tasks.stop(Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_child_stops_with_its_parent_and_a_dropped_owner_stops_both() {
        let parent = Tasks::new();
        let child = parent.child();
        child.spawn("pending", std::future::pending());
        let guard = parent.stop_on_drop();
        drop(guard);
        tokio::time::timeout(Duration::from_secs(5), child.finished())
            .await
            .expect("the child's task ended when the parent's owner went");
    }
}
