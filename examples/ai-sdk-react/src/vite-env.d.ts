/// <reference types="vite/client" />

interface ImportMetaEnv {
  readonly VITE_PARLEY_URL?: string;
  readonly VITE_PARLEY_API_KEY?: string;
}
