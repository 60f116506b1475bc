export { ParleyClient, TOKEN_REFRESH_MARGIN_MS, tokenExpiry, type ClientOptions, type TokenProvider, type UploadOptions } from "./client";
export { ParleyHttpError } from "./errors";
export * from "./format";
export * from "./reduce";
export { ChatSession, type ChatSessionOptions, type ClientToolHandler } from "./session";
export { SessionStream, type ConnectionState, type ConnectionStatus, type StreamOptions } from "./stream";
export type * from "./types";
