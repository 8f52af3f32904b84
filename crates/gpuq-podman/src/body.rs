//! The request body: nothing, a buffer, or a stream read from an `AsyncRead`
//! (an image archive can be hundreds of megabytes; it is streamed, chunked,
//! never held in memory whole).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, ReadBuf};

const CHUNK: usize = 64 * 1024;

/// An image archive (docker-archive or OCI archive tar) to load.
pub struct ImageArchive {
    pub(crate) body: ReqBody,
}

impl ImageArchive {
    /// An archive already in memory.
    pub fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        Self {
            body: ReqBody::Full(Some(bytes.into())),
        }
    }

    /// An archive streamed from a reader, e.g. a `tokio::fs::File`.
    pub fn from_reader(reader: impl AsyncRead + Send + 'static) -> Self {
        Self {
            body: ReqBody::Reader {
                reader: Box::pin(reader),
                buf: vec![0; CHUNK],
                done: false,
            },
        }
    }
}

impl fmt::Debug for ImageArchive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.body {
            ReqBody::Full(Some(b)) => write!(f, "ImageArchive({} bytes)", b.len()),
            _ => f.write_str("ImageArchive(stream)"),
        }
    }
}

pub(crate) enum ReqBody {
    Full(Option<Bytes>),
    Reader {
        reader: Pin<Box<dyn AsyncRead + Send>>,
        buf: Vec<u8>,
        done: bool,
    },
}

impl ReqBody {
    pub(crate) fn empty() -> Self {
        ReqBody::Full(None)
    }
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            ReqBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ReqBody::Reader { reader, buf, done } => {
                if *done {
                    return Poll::Ready(None);
                }
                let mut rb = ReadBuf::new(buf);
                match reader.as_mut().poll_read(cx, &mut rb) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Err(e)) => {
                        *done = true;
                        Poll::Ready(Some(Err(e)))
                    }
                    Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                        *done = true;
                        Poll::Ready(None)
                    }
                    Poll::Ready(Ok(())) => {
                        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(rb.filled())))))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReqBody::Full(b) => b.is_none(),
            ReqBody::Reader { done, .. } => *done,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReqBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ReqBody::Full(None) => SizeHint::with_exact(0),
            ReqBody::Reader { .. } => SizeHint::default(),
        }
    }
}
