//! A deadline on reading a whole request body, counted from when its headers arrived. A
//! per-frame timeout (tower-http's) resets on every byte, so a client trickling one byte a
//! second could hold a request open for as long as it liked within the size limit.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The body was not all received within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body was not received within {0:?}")]
pub struct BodyDeadlineExceeded(pub Duration);

/// A body that fails once its deadline passes, however steadily its bytes come.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    within: Duration,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        // Waiting for bytes: fail once the deadline passes (the sleep wakes this task then).
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyDeadlineExceeded(self.within))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Gives `request`'s body `within` from now to arrive whole.
pub fn bound_body(request: Request, within: Duration) -> Request {
    let (parts, inner) = request.into_parts();
    let body = DeadlineBody {
        inner,
        deadline: Box::pin(tokio::time::sleep_until(Instant::now() + within)),
        within,
    };
    Request::from_parts(parts, Body::new(body))
}
