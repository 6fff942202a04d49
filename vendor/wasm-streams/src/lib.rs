//! A stand-in for `wasm-streams` 0.5, which `server_fn` (a dependency of every Leptos 0.8 app)
//! uses to stream server functions' request and response bodies.
//!
//! The page calls no server function, so nothing here ever runs; but the real crate exports
//! its JavaScript stream classes, which the linker must keep, and with them about 5 KB of
//! WebAssembly (their futures and drop glue) that no code of the page reaches. Here the two
//! conversions `server_fn` names exist and refuse: a server function would fail with a
//! JavaScript error instead of streaming.
#![forbid(unsafe_code)]

/// The readable side, as much of it as `server_fn` names.
pub mod readable {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use futures_util::Stream;
    use wasm_bindgen::JsValue;

    /// The JavaScript type.
    pub mod sys {
        pub use web_sys::ReadableStream;
    }

    /// A JavaScript `ReadableStream`.
    pub struct ReadableStream {
        raw: sys::ReadableStream,
    }

    impl ReadableStream {
        /// Wraps a JavaScript stream.
        #[must_use]
        pub fn from_raw(raw: sys::ReadableStream) -> Self {
            Self { raw }
        }

        /// Not supported: throws a JavaScript error (no server functions on this page).
        pub fn from_stream<St>(_stream: St) -> Self
        where
            St: Stream<Item = Result<JsValue, JsValue>> + 'static,
        {
            wasm_bindgen::throw_str("streaming a request body is not supported")
        }

        /// The JavaScript stream.
        #[must_use]
        pub fn into_raw(self) -> sys::ReadableStream {
            self.raw
        }

        /// Not supported: a stream that ends at once.
        #[must_use]
        pub fn into_stream(self) -> IntoStream<'static> {
            IntoStream(std::marker::PhantomData)
        }
    }

    /// The Rust side of a stream: empty.
    pub struct IntoStream<'a>(std::marker::PhantomData<&'a ()>);

    impl Stream for IntoStream<'_> {
        type Item = Result<JsValue, JsValue>;

        fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Ready(None)
        }
    }
}

pub use readable::ReadableStream;
