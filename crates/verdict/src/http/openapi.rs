//! `GET /openapi.json`: the API described from the handlers' own annotations.

use axum::Json;
use utoipa::openapi::header::Header;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, ObjectBuilder, Ref, RefOr, Response, ResponseBuilder, Type};
use utoipa::{Modify, OpenApi};

/// The OpenAPI document of the tenant API.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "verdict",
        description = "Exactly-once trust decisions for identity-risk signals. Errors are \
                       application/problem+json (RFC 9457)."
    ),
    paths(
        super::signals::post_signal,
        super::events::list,
        super::events::show,
        super::events::subject,
        super::playbook::show,
        super::playbook::replace,
        super::playbook::simulate,
        super::deliveries::list,
        super::deliveries::show,
        super::deliveries::redeliver,
        super::keys::create,
        super::keys::list,
        super::keys::revoke,
        super::feeds::post_set,
        super::feeds::post_camara_sim_swap,
    ),
    modifiers(&ApiKey),
    security(("api_key" = []))
)]
pub struct ApiDoc;

/// Every `/v1` endpoint takes the tenant's API key as a bearer token, and may answer 401, 403
/// (the key's scope does not allow it) and 429 (the tenant's rate limit).
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A tenant API key. Its scope decides what it may do: `ingest` sends \
                         signals, `read` the GET endpoints, `admin` everything.",
                    ))
                    .build(),
            ),
        );
        let refusals: [(&str, Response); 3] = [
            ("401", problem_response("Not authenticated").build()),
            (
                "403",
                problem_response("The API key's scope does not allow this request").build(),
            ),
            (
                "429",
                problem_response("Over the tenant's rate limit; retry after `Retry-After`")
                    .header(
                        "Retry-After",
                        Header::new(ObjectBuilder::new().schema_type(Type::Integer)),
                    )
                    .build(),
            ),
        ];
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                for (status, response) in &refusals {
                    operation
                        .responses
                        .responses
                        .entry((*status).to_owned())
                        .or_insert_with(|| RefOr::T(response.clone()));
                }
            }
        }
    }
}

/// A problem+json response.
fn problem_response(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        super::problem::PROBLEM_JSON,
        Content::new(Some(Ref::from_schema_name("Problem"))),
    )
}

/// Serves the document.
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
