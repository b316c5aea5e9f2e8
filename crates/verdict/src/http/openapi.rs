//! `GET /openapi.json`: the API described from the handlers' own annotations.

use axum::Json;
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, PathItem};
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
        super::subjects::lookup,
        super::subjects::unlock,
        super::subjects::lift_deny,
        super::subjects::close_case,
        super::playbook::show,
        super::playbook::replace,
        super::playbook::simulate,
        super::deliveries::list,
        super::deliveries::show,
        super::deliveries::redeliver,
        super::deliveries::resolve,
        super::keys::create,
        super::keys::list,
        super::keys::revoke,
        super::connectors::set,
        super::connectors::list,
        super::connectors::show,
        super::connectors::delete,
        super::feeds::post_set,
        super::feeds::post_camara_sim_swap,
        super::healthz,
        super::readyz,
        super::metrics,
        document,
    ),
    modifiers(&ApiKey, &ProblemJson, &Links),
    security(("api_key" = []))
)]
pub struct ApiDoc;

/// Every `/v1` endpoint takes the tenant's API key as a bearer token, and may answer 400 (a
/// malformed parameter), 401, 403 (the key's scope does not allow it), 429 (the tenant's rate
/// limit) and 503 (the database is unreachable).
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
        let retry_after = || Header::new(ObjectBuilder::new().schema_type(Type::Integer));
        let refusals: [(&str, Response); 5] = [
            (
                "400",
                problem_response("Invalid request: a malformed query string, path or header")
                    .build(),
            ),
            ("401", problem_response("Not authenticated").build()),
            (
                "403",
                problem_response("The API key's scope does not allow this request").build(),
            ),
            (
                "429",
                problem_response("Over the tenant's rate limit; retry after `Retry-After`")
                    .header("Retry-After", retry_after())
                    .build(),
            ),
            (
                "503",
                problem_response("The database is unreachable; retry after `Retry-After`")
                    .header("Retry-After", retry_after())
                    .build(),
            ),
        ];
        for (path, item) in openapi.paths.paths.iter_mut() {
            if !path.starts_with("/v1/") {
                continue;
            }
            for operation in operations(item) {
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

/// An annotation's `body = Problem` is documented by utoipa as `application/json`; the server
/// sends every problem as `application/problem+json` (RFC 9457), and so does the document.
struct ProblemJson;

impl Modify for ProblemJson {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let problem = Ref::from_schema_name("Problem");
        let is_problem = |content: &RefOr<Content>| matches!(content, RefOr::T(Content { schema: Some(RefOr::Ref(r)), .. }) if *r == problem);
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                for response in operation.responses.responses.values_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if response
                        .content
                        .get("application/json")
                        .is_some_and(is_problem)
                        && let Some(content) = response.content.shift_remove("application/json")
                    {
                        response
                            .content
                            .insert(crate::problem::PROBLEM_JSON.to_owned(), content);
                    }
                }
            }
        }
    }
}

/// OpenAPI links: where an id in one response is a path parameter of another operation. They
/// tell a client (and the stateful fuzzer in `tests/it/openapi_fuzz.rs`) how the operations
/// chain.
struct Links;

/// (from operation, status, link name, to operation, parameter, runtime expression).
#[rustfmt::skip]
const LINKS: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("post_signal", "200", "GetEvent", "get_event", "id", "$response.body#/event_id"),
    ("post_signal", "200", "GetSubject", "get_subject", "subject_hash", "$response.body#/subject_hash"),
    ("list_events", "200", "GetEvent", "get_event", "id", "$response.body#/data/0/id"),
    ("get_event", "200", "GetSubject", "get_subject", "subject_hash", "$response.body#/subject_hash"),
    ("get_event", "200", "GetDelivery", "get_delivery", "id", "$response.body#/deliveries/0/id"),
    ("get_event", "200", "RedeliverDelivery", "redeliver_delivery", "id", "$response.body#/deliveries/0/id"),
    ("get_event", "200", "ResolveDelivery", "resolve_delivery", "id", "$response.body#/deliveries/0/id"),
    ("list_deliveries", "200", "GetDelivery", "get_delivery", "id", "$response.body#/data/0/id"),
    ("list_deliveries", "200", "RedeliverDelivery", "redeliver_delivery", "id", "$response.body#/data/0/id"),
    ("get_delivery", "200", "GetEvent", "get_event", "id", "$response.body#/event_id"),
    ("create_key", "201", "RevokeKey", "revoke_key", "key_id", "$response.body#/key_id"),
];

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for operation in operations(item) {
                let Some(from) = operation.operation_id.clone() else {
                    continue;
                };
                for &(_, status, name, to, parameter, expression) in
                    LINKS.iter().filter(|link| link.0 == from)
                {
                    if let Some(RefOr::T(response)) = operation.responses.responses.get_mut(status)
                    {
                        response.links.insert(
                            name.to_owned(),
                            RefOr::T(
                                LinkBuilder::new()
                                    .operation_id(to)
                                    .parameter(parameter, expression)
                                    .build(),
                            ),
                        );
                    }
                }
            }
        }
    }
}

/// Every operation of a path.
fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
    ]
    .into_iter()
    .flatten()
}

/// A problem+json response.
fn problem_response(description: &str) -> ResponseBuilder {
    ResponseBuilder::new().description(description).content(
        crate::problem::PROBLEM_JSON,
        Content::new(Some(Ref::from_schema_name("Problem"))),
    )
}

/// `GET /openapi.json`: this document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "operations", security(()),
    responses((status = 200, body = Object, description = "The OpenAPI 3.1 document")))]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
