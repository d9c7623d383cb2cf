// Formatting of numbers, times and durations for people. Pure functions.

export const DASH = '—';

/** A number with fixed digits, or a dash when the registry has no value. */
export function num(value, digits = 2) {
  return value === null || value === undefined || Number.isNaN(value) ? DASH : Number(value).toFixed(digits);
}

/** A price with up to four significant digits and no trailing zeros (like Python's :g). */
export function price(value) {
  return value === null || value === undefined ? DASH : String(Number(Number(value).toPrecision(4)));
}

/** A price range as the API states it: [min, max], or one value for a fixed-price contract. */
export function priceRange(min, max) {
  return min === max ? price(min) : `${price(min)} – ${price(max)}`;
}

/** A duration in seconds, coarse enough to read at a glance. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return DASH;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

/** Milliseconds since the epoch from the API's ISO 8601 timestamps (always with a zone). */
export function ms(iso) {
  return iso ? Date.parse(iso) : null;
}

const pad = (n) => String(n).padStart(2, '0');

/** Local wall-clock time HH:MM:SS. */
export function clock(iso) {
  if (!iso) return DASH;
  const d = new Date(iso);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** Local time, with the date when it is not the same day as `now`. */
export function when(iso, now = Date.now()) {
  if (!iso) return DASH;
  const d = new Date(iso);
  const today = new Date(now);
  const sameDay = d.toDateString() === today.toDateString();
  return sameDay ? clock(iso) : `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(iso)}`;
}

/** The API's refusal as a sentence: `detail` when it is text, else the validation summary. */
export function refusal(status, body) {
  if (body && typeof body.detail === 'string') return body.detail;
  if (body && typeof body.message === 'string') return body.message;
  if (body && body.detail !== undefined) return JSON.stringify(body.detail);
  return `the registry answered ${status}`;
}
