//! A connection's future polled again at once when it wakes itself while it is being polled.
//!
//! hyper's HTTP/1 connection does, on every request with a body: when the service takes the body
//! from the connection's body channel, the channel wakes the sender, which is the connection's own
//! task. tokio reads a task woken during its own poll as a task that yielded: it goes to the back
//! of the run queue, and a parked worker is woken to steal it. On a sidecar at moderate rates
//! that is a second thread woken for every call, for nothing: the connection would have been
//! polled again anyway. Here the wake is remembered and the future polled again in the same poll,
//! a few times at most; a future that keeps waking itself is then yielded as tokio would.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
};

use futures::task::AtomicWaker;

/// How often a future that woke itself is polled again within one poll before it yields.
const MAX_REPOLLS: usize = 4;

/// Not being polled: a wake wakes the task.
const IDLE: u8 = 0;
/// Being polled: a wake is remembered.
const POLLING: u8 = 1;
/// Being polled, and woken meanwhile: polled again when the poll ends.
const WOKEN: u8 = 2;

pub struct RepollOnSelfWake<F> {
    inner: Pin<Box<F>>,
    shared: Arc<Shared>,
    /// The waker `inner` is polled with: `shared`'s, made once.
    waker: Waker,
}

struct Shared {
    state: AtomicU8,
    task: AtomicWaker,
}

impl<F: Future> RepollOnSelfWake<F> {
    pub fn new(inner: F) -> Self {
        let shared = Arc::new(Shared {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        RepollOnSelfWake {
            inner: Box::pin(inner),
            waker: Waker::from(shared.clone()),
            shared,
        }
    }
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            // Remembered: the poll in progress polls again.
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

impl<F: Future> Future for RepollOnSelfWake<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        this.shared.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..=MAX_REPOLLS {
            this.shared.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(output) = this.inner.as_mut().poll(&mut inner_cx) {
                this.shared.state.store(IDLE, Ordering::Release);
                return Poll::Ready(output);
            }
            if this
                .shared
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Poll::Pending;
            }
        }
        // Still waking itself: yield, as tokio would have.
        this.shared.state.store(IDLE, Ordering::Release);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wakes itself on its first `wakes` polls, then is ready; counts its polls.
    struct WakesItself {
        wakes: usize,
        polls: usize,
    }

    impl Future for WakesItself {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.wakes {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the wakes of the task that polls the wrapper.
    #[derive(Default)]
    struct CountWakes(std::sync::atomic::AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_future_that_wakes_itself_is_polled_again_without_waking_its_task() {
        let task = Arc::new(CountWakes::default());
        let waker = Waker::from(task.clone());
        let mut future = std::pin::pin!(RepollOnSelfWake::new(WakesItself { wakes: 2, polls: 0 }));
        let polled = future.as_mut().poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(3));
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_its_task() {
        let task = Arc::new(CountWakes::default());
        let waker = Waker::from(task.clone());
        let mut future = std::pin::pin!(RepollOnSelfWake::new(WakesItself {
            wakes: 100,
            polls: 0
        }));
        let polled = future.as_mut().poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Pending);
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "yielded once");
        assert_eq!(future.inner.polls, MAX_REPOLLS + 1);
    }

    #[test]
    fn a_wake_after_the_poll_wakes_the_task() {
        let task = Arc::new(CountWakes::default());
        let waker = Waker::from(task.clone());
        let (tx, rx) = futures::channel::oneshot::channel::<u8>();
        let mut future = std::pin::pin!(RepollOnSelfWake::new(rx));
        assert!(
            future
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        assert!(tx.send(7).is_ok());
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            future.as_mut().poll(&mut Context::from_waker(&waker)),
            Poll::Ready(Ok(7))
        );
    }
}
