// Tracks the user's current run of speech from mic frame loudness: when it began, how long it has
// been voiced. Pure (the caller passes the clock); the basis of client-side barge-in.

export const FRAME_MS = 20;

export class SpeechRun {
  constructor({ onsetRms = 0.003, gapResetMs = 80 } = {}) {
    this.onsetRms = onsetRms; // about -50 dBFS: where a word's soft start begins
    this.gapResetMs = gapResetMs; // a run survives short dips between syllables
    this.voicedMs = 0;
    this.voicedAt = null; // first voiced frame of the run (page clock, ms)
    this.onsetAt = null; // first frame above onsetRms before it: the interruption's true start
    this.gapMs = 0;
    this.quietMs = 0;
  }

  // frame: {rms, voiced}; now: page clock when the frame arrived (its end).
  push(frame, now) {
    const start = now - FRAME_MS;
    if (frame.rms >= this.onsetRms) {
      if (this.onsetAt === null) this.onsetAt = start;
      this.quietMs = 0;
    } else if ((this.quietMs += FRAME_MS) > this.gapResetMs) {
      this.onsetAt = null;
    }
    if (frame.voiced) {
      if (this.voicedAt === null) this.voicedAt = start;
      this.voicedMs += FRAME_MS;
      this.gapMs = 0;
    } else if ((this.gapMs += FRAME_MS) > this.gapResetMs) {
      this.voicedMs = 0;
      this.voicedAt = null;
    }
  }

  // When the speech began: the soft onset if there is one, else the first voiced frame.
  get startedAt() {
    if (this.onsetAt !== null && this.voicedAt !== null) return Math.min(this.onsetAt, this.voicedAt);
    return this.voicedAt ?? this.onsetAt;
  }
}
