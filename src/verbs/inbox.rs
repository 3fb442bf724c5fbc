//! How the application waits for what the engine hands it on a channel: a thread, with a
//! timeout ([`receive`]), or a task, from any executor ([`next_event`], for the CM's events).
//! Both are the same wait: with inline or hybrid progress nothing else may run the engine, so
//! the waiter does; a channel the engine let go of says why the device stopped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::Result;
use crate::engine::{Completions, Driven, EngineGone, EngineHandle, Watch, HANDBACK};
use crate::transport::WorkCompletion;

/// What a look at a channel found.
pub(crate) enum Take<T> {
    Got(T),
    Empty,
    /// Its sender is gone: the engine stopped.
    Gone,
}

/// A channel's receiving side, whichever crate's.
pub(crate) trait Mailbox<T> {
    /// The next message, if one waits.
    fn try_take(&self) -> Take<T>;
    /// The next message, waiting up to `timeout` for it.
    fn take_within(&self, timeout: Duration) -> Take<T>;
    /// Whether a message waits.
    fn has_mail(&self) -> bool;
}

impl<T> Mailbox<T> for crossbeam_channel::Receiver<T> {
    fn try_take(&self) -> Take<T> {
        use crossbeam_channel::TryRecvError;
        match self.try_recv() {
            Ok(message) => Take::Got(message),
            Err(TryRecvError::Empty) => Take::Empty,
            Err(TryRecvError::Disconnected) => Take::Gone,
        }
    }

    fn take_within(&self, timeout: Duration) -> Take<T> {
        use crossbeam_channel::RecvTimeoutError;
        match self.recv_timeout(timeout) {
            Ok(message) => Take::Got(message),
            Err(RecvTimeoutError::Timeout) => Take::Empty,
            Err(RecvTimeoutError::Disconnected) => Take::Gone,
        }
    }

    fn has_mail(&self) -> bool {
        !self.is_empty()
    }
}

impl Mailbox<WorkCompletion> for Completions {
    fn try_take(&self) -> Take<WorkCompletion> {
        match self.try_pop() {
            Some(wc) => Take::Got(wc),
            None if self.stopped() => Take::Gone,
            None => Take::Empty,
        }
    }

    fn take_within(&self, timeout: Duration) -> Take<WorkCompletion> {
        match self.pop_within(timeout) {
            Some(wc) => Take::Got(wc),
            None if self.stopped() => Take::Gone,
            None => Take::Empty,
        }
    }

    fn has_mail(&self) -> bool {
        Completions::has_mail(self)
    }
}

impl<T> Mailbox<T> for flume::Receiver<T> {
    fn try_take(&self) -> Take<T> {
        match self.try_recv() {
            Ok(message) => Take::Got(message),
            Err(flume::TryRecvError::Empty) => Take::Empty,
            Err(flume::TryRecvError::Disconnected) => Take::Gone,
        }
    }

    fn take_within(&self, timeout: Duration) -> Take<T> {
        match self.recv_timeout(timeout) {
            Ok(message) => Take::Got(message),
            Err(flume::RecvTimeoutError::Timeout) => Take::Empty,
            Err(flume::RecvTimeoutError::Disconnected) => Take::Gone,
        }
    }

    fn has_mail(&self) -> bool {
        !self.is_empty()
    }
}

/// The next message on `channel`, waiting up to `timeout`; with inline or hybrid progress the
/// wait runs the engine. A channel the engine has let go of says why the device stopped.
pub(crate) fn receive<T>(
    engine: &EngineHandle,
    channel: &impl Mailbox<T>,
    timeout: Duration,
) -> Result<Option<T>> {
    let got = |take| match take {
        Take::Got(message) => Ok(Some(message)),
        Take::Empty => Ok(None),
        Take::Gone => Err(engine.gone().into()),
    };
    if !engine.waits_drive() {
        return got(channel.take_within(timeout));
    }
    // Run the engine, waiting on its socket, until a message comes or time is up; or, while
    // another thread does that, wait on the channel its turns fill.
    // A timeout past the clock's range (`Duration::MAX`) waits as long as it takes.
    let deadline = Instant::now().checked_add(timeout);
    // A stopped engine runs no turn, but what it handed out before it stopped (the completions
    // its shutdown flushed) is still the caller's, message by message, before why it stopped.
    let last_look = |gone: EngineGone| match channel.try_take() {
        Take::Got(message) => Ok(Some(message)),
        _ => Err(gone.into()),
    };
    if let Err(gone) = engine.help() {
        return last_look(gone);
    }
    loop {
        if let Some(message) = got(channel.try_take())? {
            return Ok(Some(message));
        }
        let left = deadline.map_or(Duration::MAX, |deadline| {
            deadline.saturating_duration_since(Instant::now())
        });
        if left.is_zero() {
            return Ok(None);
        }
        let driven = match engine.drive_wait(left, &|| channel.has_mail(), None) {
            Ok(driven) => driven,
            Err(gone) => return last_look(gone),
        };
        if driven == Driven::Busy {
            // That thread may stop running the engine at any time: look again soon.
            if let Some(message) = got(channel.take_within(left.min(HANDBACK)))? {
                return Ok(Some(message));
            }
        }
    }
}

/// The next CM event on `channel`, as a future any executor can run: woken when the engine
/// routes an event to the channel, or stops. With [`Progress::Inline`](super::Progress)
/// nothing runs the engine between the application's calls, so each poll runs a turn and asks
/// to be polled again (it works, but it spins), as
/// [`CompletionQueue::next_completion`](super::CompletionQueue::next_completion) does; a
/// hybrid engine's thread runs the engine while the future is pending.
pub(crate) fn next_event<'a, T>(
    engine: &'a EngineHandle,
    channel: &'a flume::Receiver<T>,
) -> NextEvent<'a, T> {
    NextEvent {
        engine,
        recv: channel.recv_async(),
        watch: None,
    }
}

/// The future of [`next_event`].
pub(crate) struct NextEvent<'a, T> {
    engine: &'a EngineHandle,
    recv: flume::r#async::RecvFut<'a, T>,
    /// While pending on a hybrid engine: its thread runs the engine meanwhile.
    watch: Option<Watch>,
}

impl<T> Future for NextEvent<'_, T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let engine = self.engine;
        let calls_only = engine.calls_only();
        if calls_only {
            // An engine that has stopped has nothing to add: the channel says the rest.
            let _ = engine.drive();
        }
        match Pin::new(&mut self.recv).poll(cx) {
            Poll::Ready(Ok(event)) => Poll::Ready(Ok(event)),
            Poll::Ready(Err(flume::RecvError::Disconnected)) => {
                Poll::Ready(Err(engine.gone().into()))
            }
            Poll::Pending => {
                if calls_only {
                    cx.waker().wake_by_ref();
                } else if self.watch.is_none() {
                    self.watch = engine.watchers().map(|watchers| watchers.begin());
                }
                Poll::Pending
            }
        }
    }
}
