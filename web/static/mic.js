// Microphone capture: getUserMedia (echo cancellation, noise suppression, AGC on) into the mic worklet.
// Hands each 20 ms PCM16 frame to a callback; knows nothing of sockets or turns.
import { MIC_SAMPLE_RATE } from "./protocol.js";

export class MicError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind; // "denied" | "missing" | "busy" | "unsupported"
  }
}

function explain(err) {
  const name = err?.name || "";
  if (name === "NotAllowedError" || name === "SecurityError") {
    return new MicError("denied", "Microphone access was blocked. Allow the microphone for this site in your browser's settings, then press Start again. You can still type below.");
  }
  if (name === "NotFoundError" || name === "OverconstrainedError") {
    return new MicError("missing", "No microphone was found. Plug one in and press Start again, or type below.");
  }
  if (name === "NotReadableError" || name === "AbortError") {
    return new MicError("busy", "The microphone is in use by another program or could not be opened. Close it there and press Start again.");
  }
  return new MicError("unsupported", `The microphone could not be started (${name || err}).`);
}

export async function startMic(onFrame, { voicedRms = 0.01 } = {}) {
  if (!navigator.mediaDevices?.getUserMedia) {
    throw new MicError("unsupported", "This page needs a secure address (https:// or localhost) to use the microphone.");
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, autoGainControl: true, channelCount: 1 },
    });
  } catch (err) {
    throw explain(err);
  }
  const context = new AudioContext({ sampleRate: MIC_SAMPLE_RATE, latencyHint: "interactive" });
  await context.audioWorklet.addModule(new URL("./mic-worklet.js", import.meta.url));
  const source = context.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(context, "parley-mic", {
    numberOfInputs: 1, numberOfOutputs: 1, channelCount: 1, channelCountMode: "explicit",
    processorOptions: { voicedRms },
  });
  node.port.onmessage = (ev) => {
    if (ev.data.type === "frame") onFrame(ev.data);
  };
  // A muted path to the destination keeps the graph pulled (and so the worklet running) everywhere.
  const mute = context.createGain();
  mute.gain.value = 0;
  source.connect(node).connect(mute).connect(context.destination);
  await context.resume();
  return {
    context,
    stream,
    async stop() {
      for (const track of stream.getTracks()) track.stop();
      node.port.onmessage = null;
      await context.close();
    },
  };
}
