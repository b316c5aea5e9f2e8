/**
 * The receiver as Express middleware:
 *
 *     app.post("/verdict", ...expressHandler(receiver, handle));
 */

import express, { type RequestHandler } from "express";

import type { Handler, Receiver } from "./receiver.js";

/**
 * A raw-body parser (the signature covers the exact bytes, not a re-serialised form) and the
 * handler that verifies, deduplicates and handles them. Mount it before any JSON body parser.
 */
export function expressHandler(receiver: Receiver, handler: Handler): RequestHandler[] {
  const raw = express.raw({ type: () => true, limit: receiver.maxBodyBytes });
  const receive: RequestHandler = (req, res, next) => {
    const body: unknown = req.body;
    if (!Buffer.isBuffer(body)) {
      res.status(400).type("text/plain").send("no raw body: mount expressHandler before any body parser");
      return;
    }
    receiver
      .receive(req.headers, body, handler)
      .then((answer) => {
        res.status(answer.status).set(answer.headers).send(answer.body);
      })
      .catch(next);
  };
  return [raw, receive];
}
