// Where Parley is and how the page authenticates, fixed at build time (vite's import.meta.env):
// VITE_PARLEY_URL empty (the default) calls the page's own origin, which the dev server proxies to Parley;
// VITE_PARLEY_API_KEY, when the server has keys. It ends up in the built JavaScript: fine for a demo, not
// for a public page (there, keep the key in a proxy of your own).
import type { UIMessage } from "ai";

export const PARLEY = import.meta.env.VITE_PARLEY_URL ?? "";
export const CHAT_API = `${PARLEY}/v1/ai-sdk/chat`;
const KEY: string = import.meta.env.VITE_PARLEY_API_KEY ?? "";

export function authHeaders(): Record<string, string> {
  return KEY ? { Authorization: `Bearer ${KEY}` } : {};
}

/** The chat's id, kept in the URL (`?chat=...`) so that a reload finds the same chat, and with it the same
 * Parley session; a page without one starts a new chat. */
export function chatIdFromUrl(): string {
  const url = new URL(window.location.href);
  let id = url.searchParams.get("chat");
  if (!id) {
    id = `chat-${crypto.randomUUID()}`;
    url.searchParams.set("chat", id);
    window.history.replaceState(null, "", url);
  }
  return id;
}

/** Parley's stored history of the chat as UIMessages (GET /v1/ai-sdk/chat/{id}/messages): the truth the
 * page starts from; a turn still running is then replayed by useChat's resume. */
export async function loadMessages(chatId: string): Promise<UIMessage[]> {
  const response = await fetch(`${CHAT_API}/${encodeURIComponent(chatId)}/messages`, { headers: authHeaders() });
  if (!response.ok) throw new Error(`GET messages: ${response.status} ${await response.text()}`);
  return (await response.json()) as UIMessage[];
}

/** Stops the turn itself (closing the request, useChat's stop(), leaves it running on the server). */
export async function cancelTurn(sessionId: string): Promise<void> {
  await fetch(`${PARLEY}/v1/sessions/${encodeURIComponent(sessionId)}/cancel`, {
    method: "POST",
    headers: authHeaders(),
  });
}
