//! Signing in to the console as a browser would: the sign-in form posted, the session cookie
//! it sets taken for the next requests.

use super::{Reply, Server};

/// The content type of a posted form.
pub const FORM: &str = "application/x-www-form-urlencoded";

/// `fields` as a form body.
pub fn encoded(fields: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish()
}

/// Posts the sign-in form with `api_key` and `headers`; the answer, read whole.
pub async fn sign_in_with(server: &Server, api_key: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = server
        .client
        .post(format!("{}/console/sign-in", server.base))
        .header("content-type", FORM)
        .body(encoded(&[("api_key", api_key)]));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    Reply::from(req.send().await.unwrap()).await
}

/// The `name=value` of the session cookie an answer sets, if it sets one.
pub fn session_cookie(reply: &Reply) -> Option<String> {
    reply
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .find(|pair| pair.starts_with("verdict_console=") && pair.len() > "verdict_console=".len())
        .map(str::to_owned)
}

/// Signs in with `api_key` and returns the session cookie (`verdict_console=…`).
pub async fn console_cookie(server: &Server, api_key: &str) -> String {
    let reply = sign_in_with(server, api_key, &[]).await;
    assert_eq!(reply.status, 303, "signing in redirects: {}", reply.text());
    session_cookie(&reply).expect("signing in sets the session cookie")
}

/// A GET of a console page with `cookie`.
pub async fn console_get(server: &Server, cookie: &str, path: &str) -> Reply {
    Reply::from(
        server
            .client
            .get(format!("{}{path}", server.base))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A form posted to a console page with `cookie`.
pub async fn console_post(
    server: &Server,
    cookie: &str,
    path: &str,
    fields: &[(&str, &str)],
) -> Reply {
    Reply::from(
        server
            .client
            .post(format!("{}{path}", server.base))
            .header("cookie", cookie)
            .header("content-type", FORM)
            .body(encoded(fields))
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// The CSRF token a console page's forms carry.
pub fn csrf_of(html: &str) -> Option<String> {
    let marker = "name=\"csrf\" value=\"";
    let at = html.find(marker)? + marker.len();
    Some(html[at..].split('"').next()?.to_owned())
}
