() => {
    // The page's edges, run once when it loads after page.js (parts.py, PAGE_JS): a login
    // that ended, a file of a kind not taken, and what people expect of a few controls.

    // A page whose login has ended (accounts turned on meanwhile, a logout in another tab)
    // goes to the login page at its first refused call, rather than showing Gradio's red
    // "Error" over every part it was updating.
    const fetched = window.fetch.bind(window);
    let leaving = false;
    window.fetch = async (...args) => {
        const answer = await fetched(...args);
        if (answer.status === 401 && !leaving
                && /\/gradio_api\//.test(String(args[0]?.url || args[0]))) {
            leaving = true;
            location.reload();
            return new Promise(() => {});  // never settles: nothing shows the refusal
        }
        return answer;
    };

    // A file of a kind the page does not take is named in the page's words, under the box
    // (Gradio's page refused the whole choice with a red "Error" listing some 40 kinds); the
    // others go on to be attached.
    document.addEventListener("change", (event) => {
        const input = event.target;
        if (!input.matches?.("#attach-row input[type=file]") || !input.accept) return;
        const kinds = input.accept.toLowerCase().split(",").map((kind) => kind.trim());
        const files = [...input.files];
        const taken = files.filter((file) => kinds.some(
            (kind) => file.name.toLowerCase().endsWith(kind)));
        if (taken.length === files.length) return;
        const refused = files.filter((file) => !taken.includes(file)).map((f) => f.name);
        window.reameHint(`Not attached: ${refused.join(", ")}: only text, Markdown, code and PDF files ` +
             "can be attached.");
        const kept = new DataTransfer();
        taken.forEach((file) => kept.items.add(file));
        input.files = kept.files;
        if (!taken.length) event.stopImmediatePropagation();
    }, true);

    // The Chatbot's trash icon deletes the chat (layout.py, CLEAR_JS): it says so, not
    // "Clear".
    const DELETE = "Delete this chat";
    const nameTrash = () => {
        for (const button of document.querySelectorAll("#chatbot button[aria-label=Clear]")) {
            button.setAttribute("aria-label", DELETE);
            button.title = DELETE;
        }
    };
    // To a screen reader each message says who wrote it (the bubbles' look alone did).
    const SPEAKERS = {user: "You said", bot: "Reame replied"};
    const nameSpeakers = () => {
        for (const [who, label] of Object.entries(SPEAKERS)) {
            for (const bubble of document.querySelectorAll(`#chatbot [data-testid=${who}]`)) {
                if (bubble.getAttribute("aria-label") === label) continue;
                bubble.setAttribute("role", "article");
                bubble.setAttribute("aria-label", label);
            }
        }
    };
    // The message box is "Message" (its label also held the Send button: "Message Send").
    const nameBox = () => {
        const box = document.querySelector("#message textarea");
        if (box && box.getAttribute("aria-label") !== "Message") {
            box.setAttribute("aria-label", "Message");
        }
    };
    const named = () => { nameTrash(); nameSpeakers(); nameBox(); };
    named();
    new MutationObserver(named).observe(document.body, {childList: true, subtree: true});

    // Esc in the search box clears it (and the list shows every chat again).
    document.addEventListener("keydown", (event) => {
        const box = event.target;
        if (event.key !== "Escape" || !box.closest?.("#chat-search") || !box.value) return;
        event.preventDefault();
        event.stopPropagation();
        box.value = "";
        box.dispatchEvent(new Event("input", {bubbles: true}));
    }, true);
}
