//! `Path` and `Query` as the handlers use them: axum's extractors with their rejections
//! (answered by axum as `text/plain`) turned into a 400 problem, so a malformed query string
//! (`?before=`, `?limit=-9223372036854775809`) or an undecodable path segment gets the same
//! `application/problem+json` as every other refusal.

use axum::extract::FromRequestParts;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::app::error::ApiError;

/// Path parameters; a rejection is a 400 problem.
pub struct Path<T>(pub T);

/// The query string; a rejection is a 400 problem.
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Self(value))
            .map_err(|rejection: PathRejection| {
                if rejection.status().is_server_error() {
                    // The route and the handler disagree about the parameters: our bug.
                    ApiError::Extraction(rejection.body_text())
                } else {
                    ApiError::Invalid(rejection.body_text())
                }
            })
    }
}

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|rejection: QueryRejection| ApiError::Invalid(rejection.body_text()))
    }
}
